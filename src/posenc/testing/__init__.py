"""A conformance check for any RoPE implementation: :func:`check_rope`.

``check_rope(impl, config)`` runs an implementation (an engine's rotary layer, a port, a kernel)
on named probes of positions (position 0, every switch point of the config's scaling, far
positions, batched and left-padded ``position_ids``, every layer type, float32 and bf16) and
compares it with posenc's float64 reading of the Hugging Face config. The
:class:`RopeReport` it returns says, per probe, the worst error, the threshold and the first
failing position; ``assert report.ok, report`` prints the table.
"""

from .check import check_rope, rope_layer_types
from .probes import Probe, rope_probes
from .reference import Reference
from .report import ProbeResult, RopeReport

__all__ = [
    "Probe",
    "ProbeResult",
    "Reference",
    "RopeReport",
    "check_rope",
    "rope_layer_types",
    "rope_probes",
]
