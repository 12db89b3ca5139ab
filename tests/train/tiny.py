"""The command-line options of a training run small enough for a test (a few seconds on one
thread), shared by the tests that drive ``attnkit train``; each adds its task, steps and out."""

TINY_TRAIN_ARGS = [
    *("--length", "5", "--symbols", "6"),
    *("--d-model", "16", "--heads", "2", "--layers", "1", "--ff", "32"),
    *("--batch-size", "8", "--warmup", "4", "--eval-size", "20"),
    "--no-progress",
]
