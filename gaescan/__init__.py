"""gaescan: GAE and discounted scans at the speed of memory.

Public API: :func:`gae`, :func:`discounted_returns`, :func:`linear_scan`, and
the carry API for rows split into time slices (:func:`gae_summary`,
:func:`returns_summary`, :func:`scan_summary`, :func:`vtrace_summary`,
:func:`bootstrap_summary`, :func:`carry_in`), and the outcome-advantage statistics (:func:`group_normalize`,
:func:`whiten`, :func:`moments`, :func:`combine_moments`).  Their semantics are
fixed in the semantic contract (``docs/semantics.md``).
"""

from ._api import GAEResult, discounted_returns, gae, linear_scan
from ._carry import (
    ScanSummary,
    bootstrap_summary,
    carry_in,
    gae_summary,
    returns_summary,
    scan_summary,
    vtrace_summary,
)
from ._stats import Moments, combine_moments, group_normalize, moments, whiten
from ._turn_gae import turn_gae
from ._vtrace import VTraceResult, vtrace

__all__ = [
    "GAEResult",
    "gae",
    "discounted_returns",
    "linear_scan",
    "ScanSummary",
    "gae_summary",
    "returns_summary",
    "scan_summary",
    "vtrace_summary",
    "bootstrap_summary",
    "carry_in",
    "group_normalize",
    "whiten",
    "moments",
    "combine_moments",
    "VTraceResult",
    "vtrace",
    "turn_gae",
    "Moments",
    "__version__",
]
__version__ = "0.1.0"
