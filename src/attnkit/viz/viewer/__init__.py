"""The interactive attention viewer: one self-contained HTML page with a head view, a
model view and a matrix view, for causal, bidirectional and encoder–decoder attention.

- :class:`ViewerData` / :class:`Section`: what the page shows, with a JSON form
  (``docs/viewer.md``).
- :func:`render_html`, :func:`write_html`: the page, script, style and data inlined.
- :func:`viewer_data_from_run` and friends: data from ``attnkit.models`` runs and
  ``attnkit.nn`` weight records.
"""

from attnkit.viz.viewer.adapters import (
    model_name,
    viewer_data_from_encoder_decoder,
    viewer_data_from_lm_output,
    viewer_data_from_run,
    viewer_data_from_transformer_output,
)
from attnkit.viz.viewer.data import KINDS, SCALE, Section, ViewerData
from attnkit.viz.viewer.render import content_security_policy, embed_json, render_html, write_html

__all__ = [
    "KINDS",
    "SCALE",
    "Section",
    "ViewerData",
    "content_security_policy",
    "embed_json",
    "model_name",
    "render_html",
    "viewer_data_from_encoder_decoder",
    "viewer_data_from_lm_output",
    "viewer_data_from_run",
    "viewer_data_from_transformer_output",
    "write_html",
]
