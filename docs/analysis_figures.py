"""Draw the figures of docs/analysis.md into docs/images/ from real SmolLM2 runs:

    python docs/analysis_figures.py

- analysis-it-animal-weight-vs-value.png: how much "it" attends to "animal" in every head,
  by weight and by value-weighted attention;
- analysis-layer13-head8-raw-vs-value.png: one head's map both ways;
- analysis-rollout-layer13.png: attention rollout up to layer 13;
- analysis-ablation.png and analysis-patching.png: the grids of the command-line examples;
- analysis-patching-positions.png: patching resid_pre at each layer and position.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "images"

TEXT = "The animal didn't cross the street because it was too tired"
ABLATION_TEXT = "The animal didn't cross the street because it was too tired. So the"
ABLATION_TARGET = " animal"
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


def main() -> int:
    import torch
    from matplotlib.figure import Figure

    from attnkit import models
    from attnkit.inspect import interventions, methods
    from attnkit.inspect.heads import find_token
    from attnkit.inspect.maps import attention_map
    from attnkit.viz.export import write_effects
    from attnkit.viz.head_grid import plot_head_grid
    from attnkit.viz.heatmap import draw_heatmap, plot_attention

    model = models.load("smollm2")
    OUT.mkdir(parents=True, exist_ok=True)
    amap = attention_map(model, TEXT, layer=0)
    texts = [t.text for t in amap.readable]
    it, animal = find_token(texts, "it")[0], find_token(texts, "animal")[0]

    run = model.run(TEXT)
    by_weight = torch.stack([run.attentions[i][0, :, it, animal] for i in range(model.num_layers)])  # [L, h]
    value = methods.value_weighted(model, TEXT)
    by_value = torch.stack([value.heads[i][:, it, animal] for i in range(model.num_layers)])  # [L, h]
    fig = Figure(figsize=(10, 9))
    plot_head_grid(by_weight, title='"it" → "animal": attention weight', label="weight", ax=fig.add_subplot(1, 2, 1))
    plot_head_grid(
        by_value, title='"it" → "animal": value-weighted ‖α·f(x)‖', label="norm", ax=fig.add_subplot(1, 2, 2)
    )
    fig.tight_layout()
    fig.savefig(OUT / "analysis-it-animal-weight-vs-value.png", dpi=90)

    fig = Figure(figsize=(12, 5.5))
    plot_attention(
        run.attentions[13][0, 8],
        amap.labels,
        amap.labels,
        title="Layer 13, head 8: weight",
        causal=True,
        ax=fig.add_subplot(1, 2, 1),
    )
    plot_attention(
        value.heads[13][8],
        amap.labels,
        amap.labels,
        title="Layer 13, head 8: value-weighted",
        causal=True,
        ax=fig.add_subplot(1, 2, 2),
    )
    fig.tight_layout()
    fig.savefig(OUT / "analysis-layer13-head8-raw-vs-value.png", dpi=90)

    rollout = methods.method_map(model, TEXT, method="rollout", layer=13)
    draw_heatmap(
        rollout.weights[0],
        rollout.labels,
        rollout.labels,
        OUT / "analysis-rollout-layer13.png",
        title="Attention rollout up to layer 13 — smollm2",
        causal=True,
        dpi=90,
    )

    for effects, name in (
        (interventions.head_ablation(model, ABLATION_TEXT, target=ABLATION_TARGET), "analysis-ablation"),
        (interventions.activation_patching(model, CLEAN, CORRUPT, target=" Mary", wrong=" John"), "analysis-patching"),
        (
            interventions.activation_patching(
                model, CLEAN, CORRUPT, by="layer-position", target=" Mary", wrong=" John"
            ),
            "analysis-patching-positions",
        ),
    ):
        (written,) = write_effects(effects, OUT, ["png"], dpi=90)
        written.rename(OUT / f"{name}.png")
    for path in sorted(OUT.glob("analysis-*.png")):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
