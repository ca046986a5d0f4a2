"""gaescan: GAE and discounted scans at the speed of memory.

Public API: :func:`gae`, :func:`discounted_returns`, :func:`linear_scan`.
Their semantics are fixed in the project's SPEC (see the documentation).
"""

from ._api import GAEResult, discounted_returns, gae, linear_scan

__all__ = ["GAEResult", "gae", "discounted_returns", "linear_scan", "__version__"]
__version__ = "0.1.0"
