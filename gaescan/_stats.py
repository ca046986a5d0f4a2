r"""Outcome advantages and masked statistics: :func:`group_normalize`, :func:`whiten`,
:func:`moments` and :func:`combine_moments`.

The public functions resolve their arrays (:mod:`gaescan._arrays`), choose the
backend (:func:`gaescan._dispatch.choose`), validate the arguments here, once,
for every backend, allocate the output, and hand compute-namespace views to
the backend module:

* ``"numba"``: :mod:`gaescan.backends.stats_numba` (parallel CPU kernels);
* ``"numpy"``: :mod:`gaescan.backends.stats_numpy` (NumPy-API code, NumPy or CuPy);
* ``"cuda"``: :mod:`gaescan.backends.stats_cuda` (Numba CUDA kernels for the
  moments and whitening, the NumPy-API group code on CuPy; no value is read
  back to the host).

Statistics are accumulated in float64 whatever the data dtype, and the
results are rounded to the output dtype once.
"""

from __future__ import annotations

import importlib
import numbers
import sys
from typing import Any, NamedTuple

import numpy as np

from . import _validate as v
from ._arrays import Context, any_dask, may_overlap, resolve, takes_dask
from ._dispatch import choose

__all__ = ["Moments", "group_normalize", "whiten", "moments", "combine_moments"]

_MODULES = {
    "numba": "gaescan.backends.stats_numba",
    "numpy": "gaescan.backends.stats_numpy",
    "cuda": "gaescan.backends.stats_cuda",
}
_F8 = np.dtype(np.float64)
# Nobody holds a Dask array before Dask is imported: one lookup skips the scan of the arguments.
_DASK = "dask"


class Moments(NamedTuple):
    r"""Statistics of the valid elements of an array, which combine across parts.

    Attributes
    ----------
    count : array
        The number of valid elements, a float64 0-d array holding an integer
        (exact up to :math:`2^{53}`): all three fields are float64, so they
        stack into one array for a collective such as ``all_gather``.
    mean : array
        Their mean (0 when ``count`` is 0), float64.
    m2 : array
        The centred sum of squares :math:`\sum (x - \mathrm{mean})^2`, float64.
    """

    count: Any
    mean: Any
    m2: Any


# --------------------------------------------------------------------------- argument checks


def _flag(x: Any, name: str) -> bool:
    if x is True or x is False or isinstance(x, np.bool_):
        return bool(x)
    raise TypeError(f"{name} must be a bool (True or False), got {x!r}")


def _ddof(ddof: Any) -> int:
    if isinstance(ddof, (bool, np.bool_)) or not isinstance(ddof, (numbers.Integral, np.integer)):
        raise TypeError(f"ddof must be a non-negative integer (0: biased, 1: unbiased), got {ddof!r}")
    if ddof < 0:
        raise ValueError(f"ddof must be a non-negative integer (0: biased, 1: unbiased), got {ddof}")
    return int(ddof)


def _eps(eps: Any) -> float:
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, (numbers.Real, np.floating, np.integer)):
        raise TypeError(f"eps must be a real number >= 0, got {eps!r}")
    e = float(eps)
    if not e >= 0.0 or e == np.inf:
        raise ValueError(f"eps must be a finite real number >= 0, got {eps!r}")
    return e


def _array(x: Any, name: str) -> Any:
    """A numeric array argument (never a bare Python scalar)."""
    if v.is_scalar(x) and not hasattr(x, "shape"):
        raise TypeError(f"{name!r} must be an array, got the scalar {x!r}")
    if x.dtype.kind not in "biuf":
        raise TypeError(f"{name!r} must hold real numbers (bool, integer or float), got dtype {x.dtype}")
    return x


def _output(xp: Any, out: Any, shape: tuple, dtype: np.dtype, inputs: dict[str, Any]) -> Any:
    """The caller's ``out=`` (checked) or a new array."""
    if out is None:
        return xp.empty(shape, dtype=dtype)
    if v.is_scalar(out) and not hasattr(out, "shape"):
        raise TypeError(f"out must be an array, got {out!r}; or pass out=None to allocate the result")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(
            f"out must have the result's shape {tuple(shape)} and dtype {dtype}, "
            f"got shape {tuple(out.shape)} and dtype {out.dtype}"
        )
    if xp is np and not out.flags.writeable:
        raise ValueError("out is read-only")
    for name, x in inputs.items():
        if x is not None and hasattr(x, "shape") and x.size and out.size and may_overlap(xp, out, x):
            raise ValueError(f"out overlaps the input {name!r}; outputs must not alias inputs")
    return out


def _load(name: str) -> Any:
    return importlib.import_module(_MODULES[name])


def _start(named: dict[str, Any], backend: str) -> tuple[Context, str]:
    ctx = resolve(named)
    return ctx, choose(backend, ctx)


def _check_groups(s: Any, labels: Any, group_size: int | None) -> int:
    """``scores`` and ``groups``/``group_size`` fit together; returns ``B``."""
    _array(s, "scores")
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D (one score per sequence, shape (B,)), got shape {tuple(s.shape)}")
    B = s.shape[0]
    if labels is not None:
        if v.is_scalar(labels) and not hasattr(labels, "shape"):
            raise TypeError(f"groups must be an integer array of shape ({B},), got the scalar {labels!r}")
        if labels.dtype.kind not in "iu":
            raise TypeError(
                f"groups must hold integer labels, got dtype {labels.dtype}; map other labels to "
                "integers first (e.g. numpy.unique(labels, return_inverse=True)[1])"
            )
        if tuple(labels.shape) != (B,):
            raise ValueError(
                f"groups has shape {tuple(labels.shape)} but scores has shape {(B,)}; "
                "they need one label per score"
            )
    elif B != B:  # NaN: a Dask array of unknown length
        raise ValueError(
            f"group_size={group_size} needs the number of scores, which this Dask array does not know "
            "(its chunk sizes are unknown); call scores.compute_chunk_sizes() first, or pass groups= labels"
        )
    elif B % group_size:
        raise ValueError(
            f"group_size={group_size} does not divide the number of scores {B}; pass groups= "
            "labels for groups of unequal size"
        )
    return int(B)


# --------------------------------------------------------------------------- group_normalize


@takes_dask
def group_normalize(
    scores: Any,
    *,
    groups: Any = None,
    group_size: Any = None,
    leave_one_out: bool = False,
    scale: bool = True,
    ddof: int = 1,
    eps: float = 1e-6,
    out: Any = None,
    backend: str = "auto",
) -> Any:
    r"""Group-relative outcome advantages: GRPO, Dr. GRPO, RLOO, leave-one-out GRPO.

    For sequence :math:`i` in group :math:`G` of :math:`n` members:

    .. math::

        b_i &= \frac{1}{n} \sum_{j \in G} s_j
            \quad\text{or, with leave\_one\_out,}\quad
            b_i = \frac{1}{n - 1} \Bigl(\sum_{j \in G} s_j - s_i\Bigr) \\
        \sigma_G &= \sqrt{\frac{1}{n - \mathrm{ddof}} \sum_{j \in G} (s_j - \bar s_G)^2} \\
        A_i &= \frac{s_i - b_i}{\sigma_G + \mathrm{eps}}
            \quad\text{(scale=True)}, \qquad A_i = s_i - b_i \quad\text{(scale=False)}

    and :math:`A_i = s_i` when :math:`n = 1`, or :math:`n \le \mathrm{ddof}`
    with ``scale=True`` (there is nothing to compare with).  GRPO is the
    default; Dr. GRPO is ``scale=False``; RLOO is ``leave_one_out=True,
    scale=False``.  The sums are float64 and centred (two passes: the mean,
    then the squares around it), never :math:`E[s^2] - E[s]^2`.  A NaN or
    inf score makes its own group's advantages NaN and no other group's.
    With ``eps=0`` a group of equal scores gives 0/0 = NaN, as the formula
    does.  Token-level advantages are ``adv[:, None] * response_mask``.

    Parameters
    ----------
    scores : array_like, shape (B,)
        One outcome score per sequence.
    groups : array of int, shape (B,), optional
        A label per sequence: equal labels form one group.  Labels need not
        be sorted, contiguous or small.  Exclusive with ``group_size``.
    group_size : int, optional
        Consecutive groups of ``group_size`` sequences (``B`` must be a
        multiple of it).  Exclusive with ``groups``.
    leave_one_out : bool, default False
        Use the mean of the *other* members as the baseline (RLOO).
    scale : bool, default True
        Divide by ``σ_G + eps``.
    ddof : int, default 1
        Delta degrees of freedom of ``σ_G``: 1 is the unbiased (Bessel) std
        of ``torch.std``, 0 the biased one of ``numpy.std``.
    eps : float, default 1e-6
        Added to ``σ_G`` (outside the square root).
    out : array, optional
        Preallocated result of shape ``(B,)`` and the result's dtype.
    backend : {"auto", "numba", "numpy", "cuda"}
        ``"auto"`` follows the array type.

    Returns
    -------
    array, shape (B,)
        The advantages, float64 if ``scores`` is float64, else float32, in the
        inputs' array library.

    Raises
    ------
    TypeError
        Labels that are not integers; flags that are not bools; a ``ddof``
        that is not an integer; mixed array libraries or devices.
    ValueError
        Both or neither of ``groups`` and ``group_size``; ``scores`` not 1-D;
        labels of another length; ``group_size`` not dividing ``B``;
        ``ddof < 0``; ``eps < 0``; an ``out`` of the wrong shape or dtype.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> s = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    >>> gaescan.group_normalize(s, groups=np.array([7, 7, 3, 3, 7, 3]), eps=0.0).round(4)
    array([ 1.1547, -0.5774,  0.5774,  0.5774, -0.5774, -1.1547])
    >>> gaescan.group_normalize(s, group_size=3, leave_one_out=True, scale=False)
    array([ 0.5, -1. ,  0.5,  1. , -0.5, -0.5])
    """
    loo = _flag(leave_one_out, "leave_one_out")
    scale = _flag(scale, "scale")
    ddof = _ddof(ddof)
    eps = _eps(eps)
    if (groups is None) == (group_size is None):
        raise ValueError(
            "pass exactly one of groups= (an integer label per sequence) or group_size= "
            "(consecutive groups of that many sequences)"
        )
    if group_size is not None:
        if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, (numbers.Integral, np.integer)):
            raise TypeError(f"group_size must be a positive integer, got {group_size!r}")
        if group_size < 1:
            raise ValueError(f"group_size must be a positive integer, got {group_size}")
        group_size = int(group_size)
    if _DASK in sys.modules and any_dask(scores, groups, out):
        return _dask_group_normalize(scores, groups, group_size, out, backend, leave_one_out=loo, scale=scale,
                                     ddof=ddof, eps=eps)
    named = {"scores": scores, "groups": groups, "out": out}
    ctx, name = _start(named, backend)
    with ctx.call(named) as (xp, c):
        s, labels = c["scores"], c["groups"]
        B = _check_groups(s, labels, group_size)
        dtype = v.data_dtype(s)
        res = _output(xp, c["out"], (B,), dtype, {"scores": s, "groups": labels})
        if B:
            _load(name).group_normalize(xp, s, labels, group_size, loo, scale, ddof, eps, res)
    if out is not None:
        return out
    return ctx.from_compute(res)


# --------------------------------------------------------------------------- moments and whiten


def _mask(x: Any, mask: Any) -> Any:
    if mask is None:
        return None
    _array(mask, "mask")
    if tuple(mask.shape) != tuple(x.shape):
        raise ValueError(
            f"'mask' has shape {tuple(mask.shape)} but 'x' has shape {tuple(x.shape)}; they must match exactly"
        )
    return mask


def _moment_fields(m: Any, name: str) -> tuple[Any, Any, Any]:
    if isinstance(m, (str, bytes)) or not isinstance(m, (tuple, list)) or len(m) != 3:
        raise TypeError(
            f"{name} must be a gaescan.Moments (count, mean, m2), as returned by gaescan.moments or "
            f"gaescan.combine_moments, got {type(m).__name__}"
        )
    return m[0], m[1], m[2]


def _host_count_check(count: Any, name: str) -> None:
    c = np.asarray(count)
    if c.size and not np.all(c >= 0):
        raise ValueError(f"{name}.count must be >= 0, got {count!r}")


def _stat(xp: Any, f: Any, name: str, ndim: int | None) -> Any:
    """A statistics field as a float64 array of ``xp`` (scalars allowed where ``ndim == 0``)."""
    if f is None:
        raise TypeError(f"{name} must be a number or an array, got None")
    if isinstance(f, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real number, got {f!r}")
    if not hasattr(f, "shape"):
        if ndim != 0 or not isinstance(f, numbers.Real):
            raise TypeError(f"{name} must be a {'real number' if ndim == 0 else 'array'}, got {f!r}")
        return xp.asarray(float(f), dtype=_F8)
    if f.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got dtype {f.dtype}")
    if ndim is not None and f.ndim != ndim:
        raise ValueError(f"{name} must be a scalar or a 0-d array, got shape {tuple(f.shape)}")
    return f.astype(_F8)


@takes_dask
def moments(x: Any, mask: Any = None, *, backend: str = "auto") -> Moments:
    r"""Count, mean and centred sum of squares of the valid elements of ``x``.

    Over every element of ``x`` (any shape) where ``mask`` is true:

    .. math::

        \mathrm{count} = \sum_i m_i, \qquad
        \mathrm{mean} = \frac{1}{\mathrm{count}} \sum_i m_i x_i, \qquad
        m_2 = \sum_i m_i (x_i - \mathrm{mean})^2

    accumulated in float64 and centred (each chunk's statistics centred to
    float64 precision, merged with the pairwise update of
    :func:`combine_moments`), never :math:`E[x^2] - E[x]^2`, so the result
    holds when ``|mean| ≫ std``.  Masked elements are never read.
    ``count == 0`` gives ``mean = m2 = 0``.  The variance is
    ``m2 / (count − ddof)``.

    Parameters
    ----------
    x : array_like
        The data, any shape.
    mask : array_like, optional
        Of the shape of ``x``; nonzero marks the valid elements.  Default: all.
    backend : {"auto", "numba", "numpy", "cuda"}
        ``"auto"`` follows the array type.

    Returns
    -------
    Moments
        ``(count, mean, m2)``: float64 0-d arrays in the input's array library
        and device.  All-gather them across ranks and merge with
        :func:`combine_moments`, then pass the result to :func:`whiten`.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> m = gaescan.moments(np.array([1.0, 2.0, 3.0, 100.0]), np.array([1, 1, 1, 0]))
    >>> float(m.count), float(m.mean), float(m.m2)
    (3.0, 2.0, 2.0)
    """
    if _DASK in sys.modules and any_dask(x, mask):
        return _dask_moments(x, mask, backend)
    named = {"x": x, "mask": mask}
    ctx, name = _start(named, backend)
    with ctx.call(named) as (xp, c):
        xa = _array(c["x"], "x")
        mk = _mask(xa, c["mask"])
        stats = _load(name).moments(xp, xa, mk)
        # 0-d arrays, not NumPy scalars: they convert back to every library.
        fields = [xp.asarray(s, dtype=_F8) for s in stats]
    return Moments(*(ctx.from_compute(f) for f in fields))


@takes_dask
def whiten(
    x: Any,
    mask: Any = None,
    *,
    shift_mean: bool = True,
    ddof: int = 1,
    eps: float = 1e-8,
    moments: Moments | None = None,
    out: Any = None,
    backend: str = "auto",
) -> Any:
    r"""Masked whitening: normalise the valid elements of ``x`` to zero mean and unit variance.

    With the statistics of the valid elements (:func:`moments`, or the
    ``moments`` given):

    .. math::

        \mathrm{var} = \frac{m_2}{\mathrm{count} - \mathrm{ddof}}, \qquad
        y = \frac{x - \mathrm{mean}}{\sqrt{\mathrm{var} + \mathrm{eps}}}
            \ \bigl(+\,\mathrm{mean} \text{ when shift\_mean=False}\bigr)

    at valid positions and exactly 0 at masked ones.  ``count <= ddof``
    gives ``var = 0``; ``count == 0`` gives all zeros (no NaN, no warning);
    with ``eps=0`` a zero variance gives 0/0 = NaN, as the formula does.
    Masked elements are never read: a NaN there changes nothing.

    Parameters
    ----------
    x : array_like
        The data (e.g. token advantages ``[B, L]``), any shape.
    mask : array_like, optional
        Of the shape of ``x``; nonzero marks the valid elements (e.g. the
        response mask).  Default: all.
    shift_mean : bool, default True
        Subtract the mean; ``False`` adds it back after scaling (verl's and
        OpenRLHF's ``shift_mean=False``).
    ddof : int, default 1
        Delta degrees of freedom of the variance (1: unbiased, 0: biased).
    eps : float, default 1e-8
        Added to the variance (inside the square root).
    moments : Moments, optional
        Statistics to use instead of the local ones, e.g. the
        :func:`combine_moments` of every data- and context-parallel rank's
        :func:`moments`.
    out : array, optional
        Preallocated result of the shape of ``x`` and the result's dtype.
    backend : {"auto", "numba", "numpy", "cuda"}
        ``"auto"`` follows the array type.

    Returns
    -------
    array
        ``y``, of the shape of ``x``; float64 if ``x`` is float64, else float32.

    Raises
    ------
    TypeError
        ``moments`` that is not a :class:`Moments`; non-numeric arrays; mixed
        array libraries or devices.
    ValueError
        A ``mask`` of another shape; ``ddof < 0``; ``eps < 0``; an ``out`` of
        the wrong shape or dtype.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> x = np.array([[3.0, 3.0, 5.0], [5.0, np.nan, np.nan]])
    >>> gaescan.whiten(x, x == x, ddof=0, eps=0.0)   # mean 4, variance 1; NaN masked out
    array([[-1., -1.,  1.],
           [ 1.,  0.,  0.]])
    """
    shift_mean = _flag(shift_mean, "shift_mean")
    ddof = _ddof(ddof)
    eps = _eps(eps)
    if moments is not None:
        _moment_fields(moments, "moments")
    if _DASK in sys.modules and any_dask(x, mask, out, *(moments or ())):
        return _dask_whiten(x, mask, moments, out, backend, shift_mean=shift_mean, ddof=ddof, eps=eps)
    named = {"x": x, "mask": mask, "out": out}
    if moments is not None:
        mc, mm, mv = _moment_fields(moments, "moments")
        named.update({"moments.count": mc, "moments.mean": mm, "moments.m2": mv})
    ctx, name = _start(named, backend)
    with ctx.call(named) as (xp, c):
        xa = _array(c["x"], "x")
        mk = _mask(xa, c["mask"])
        stats = None
        if moments is not None:
            stats = tuple(_stat(xp, c[f"moments.{f}"], f"moments.{f}", 0) for f in ("count", "mean", "m2"))
            if xp is np:
                _host_count_check(stats[0], "moments")
            if name == "numba":
                stats = tuple(float(s) for s in stats)
        dtype = v.data_dtype(xa)
        given = {f"moments.{f}": c[f"moments.{f}"] for f in Moments._fields} if moments is not None else {}
        res = _output(xp, c["out"], tuple(xa.shape), dtype, {"x": xa, "mask": mk, **given})
        if xa.size:
            _load(name).whiten(xp, xa, mk, stats, shift_mean, ddof, eps, res)
    if out is not None:
        return out
    return ctx.from_compute(res)


def combine_moments(ms: Any) -> Moments:
    r"""Merge the moments of disjoint parts into the moments of their union.

    The pairwise (Chan et al.) update of two parts :math:`a, b`:

    .. math::

        n &= n_a + n_b, \qquad \delta = \mathrm{mean}_b - \mathrm{mean}_a \\
        \mathrm{mean} &= \mathrm{mean}_a + \delta\,\frac{n_b}{n}, \qquad
        m_2 = m_{2,a} + m_{2,b} + \delta^2\,\frac{n_a n_b}{n}

    applied as a balanced tree over the parts, in part order (deterministic).
    Empty parts (``count == 0``) are skipped, whatever their ``mean`` and
    ``m2`` hold.  The result equals the one-shot :func:`moments` of the
    concatenated data to rounding.

    Parameters
    ----------
    ms : Moments or sequence of Moments
        A :class:`Moments` whose fields are stacked along a leading axis, one
        entry per part (e.g. ``torch.stack`` of each rank's moments after an
        ``all_gather``); or a list of :class:`Moments`, which is stacked.
        Trailing axes, if any, are independent sets of statistics.

    Returns
    -------
    Moments
        float64 arrays (0-d for 1-D fields) in the fields' array library.

    Examples
    --------
    >>> import numpy as np, gaescan
    >>> x = np.arange(10.0)
    >>> parts = [gaescan.moments(x[:3]), gaescan.moments(x[3:]), gaescan.moments(x[:0])]
    >>> m = gaescan.combine_moments(parts)
    >>> float(m.count), float(m.mean), float(m.m2)
    (10.0, 4.5, 82.5)
    """
    listed = isinstance(ms, (list, tuple)) and not isinstance(ms, Moments)
    if listed and not ms:
        raise ValueError("ms is empty: give at least one gaescan.Moments (an empty part is one of count 0)")
    if listed and all(isinstance(m, Moments) for m in ms):
        parts = [_moment_fields(m, f"ms[{i}]") for i, m in enumerate(ms)]
        named = {f"ms[{i}].{f}": p[j] for i, p in enumerate(parts) for j, f in enumerate(Moments._fields)}
        if all(v.is_scalar(x) for x in named.values()):
            # Python or NumPy numbers only (Moments(2.0, 1.0, 0.5), as whiten's moments= takes): NumPy
            named = {k: np.asarray(x, dtype=np.float64) for k, x in named.items()}
        ctx = resolve(named)
        with ctx.call(named) as (xp, c):
            fields = [xp.stack([_stat(xp, c[f"ms[{i}].{f}"], f"ms[{i}].{f}", None) for i in range(len(parts))])
                      for f in Moments._fields]
            result = _combine(xp, *fields)
        return Moments(*(ctx.from_compute(f) for f in result))
    count, mean, m2 = _moment_fields(ms, "ms")
    named = {"ms.count": count, "ms.mean": mean, "ms.m2": m2}
    ctx = resolve(named)
    with ctx.call(named) as (xp, c):
        fields = [_stat(xp, c[f"ms.{f}"], f"ms.{f}", None) for f in Moments._fields]
        shape = tuple(fields[0].shape)
        if len(shape) == 0:
            raise ValueError(
                "ms must hold the parts stacked along a leading axis (fields of shape (P,)); "
                "got 0-d fields: pass a list of Moments, or stack them"
            )
        for f, a in zip(Moments._fields, fields, strict=True):
            if tuple(a.shape) != shape:
                raise ValueError(f"ms.{f} has shape {tuple(a.shape)} but ms.count has shape {shape}")
        if xp is np:
            _host_count_check(fields[0], "ms")
        result = _combine(xp, *fields)
    return Moments(*(ctx.from_compute(f) for f in result))


@np.errstate(invalid="ignore")  # inf − inf from an infinite element: the NaN is the result
def _combine(xp: Any, n: Any, mean: Any, m2: Any) -> tuple[Any, Any, Any]:
    """The tree of pairwise merges along axis 0 (float64 arrays of ``xp``)."""
    if n.shape[0] == 0:
        return tuple(xp.zeros(n.shape[1:], dtype=_F8) for _ in range(3))
    # An empty part contributes nothing, whatever its mean and m2 hold (NaN, for
    # the mean of an empty tensor).
    empty = n == 0
    mean = xp.where(empty, 0.0, mean)
    m2 = xp.where(empty, 0.0, m2)
    while n.shape[0] > 1:
        h = n.shape[0] // 2
        na, nb = n[0:2 * h:2], n[1:2 * h:2]
        ma, mb = mean[0:2 * h:2], mean[1:2 * h:2]
        tot = na + nb
        safe = xp.where(tot > 0, tot, 1.0)
        delta = mb - ma
        mc = xp.where(na == 0, mb, xp.where(nb == 0, ma, ma + delta * (nb / safe)))
        m2c = m2[0:2 * h:2] + m2[1:2 * h:2] + xp.where((na == 0) | (nb == 0), 0.0, delta * delta * (na * nb / safe))
        if n.shape[0] % 2:
            tot = xp.concatenate([tot, n[-1:]])
            mc = xp.concatenate([mc, mean[-1:]])
            m2c = xp.concatenate([m2c, m2[-1:]])
        n, mean, m2 = tot, mc, m2c
    # ``[0, ...]``: 0-d arrays (NumPy gives a scalar for ``[0]``).
    return n[0, ...], mean[0, ...], m2[0, ...]


# --------------------------------------------------------------------------- Dask
#
# Dask arrays build lazy graphs whose blocks run the functions above (each
# block on the backend of its chunk type, or the caller's ``backend=``):
# ``moments`` is a tree reduction of the blocks' moments with the pairwise
# update; ``whiten`` maps every block with the global moments; ``group_normalize``
# needs every member of a group at once, so it runs on one block of the
# scores (``B`` is one score per sequence, small next to the token arrays).


def _dask_arrays(x: Any, mask: Any, out: Any) -> tuple[Any, Any]:
    import dask.array as da

    from .backends.dask import chunk_libraries

    if out is not None:
        raise TypeError("out= is not supported with Dask arrays: the result is a new lazy array")
    chunk_libraries({"x": x, "mask": mask})
    x = x if any_dask(x) else da.asarray(x)
    _array(x, "x")
    if mask is not None:
        _array(mask, "mask")
        if tuple(mask.shape) != tuple(x.shape):
            raise ValueError(
                f"'mask' has shape {tuple(mask.shape)} but 'x' has shape {tuple(x.shape)}; they must match exactly"
            )
        mask = (mask if any_dask(mask) else da.asarray(mask)).rechunk(x.chunks)
    return x, mask


def _block_moments(xb: Any, mb: Any, backend: str) -> np.ndarray:
    m = moments(xb, mb, backend=backend)
    return np.array([float(f) for f in m])


def _merge_moments(*parts: np.ndarray) -> np.ndarray:
    n, mean, m2 = _combine(np, *np.stack(parts).T.copy())
    return np.array([float(n), float(mean), float(m2)])


def _dask_moments(x: Any, mask: Any, backend: str) -> Moments:
    import dask
    import dask.array as da

    x, mask = _dask_arrays(x, mask, None)
    xs = list(x.to_delayed().ravel())
    ms = [None] * len(xs) if mask is None else list(mask.to_delayed().ravel())
    parts = [dask.delayed(_block_moments, pure=True)(a, b, backend) for a, b in zip(xs, ms, strict=True)]
    while len(parts) > 1:
        parts = [dask.delayed(_merge_moments, pure=True)(*parts[i:i + 2]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    stats = da.from_delayed(parts[0], shape=(3,), dtype=_F8, meta=np.empty(0, _F8))
    return Moments(stats[0], stats[1], stats[2])


def _whiten_block(xb: Any, mb: Any, st: Any, **kw: Any) -> Any:
    return whiten(xb, mb, moments=Moments(st[0], st[1], st[2]), **kw)


def _dask_whiten(x: Any, mask: Any, stats: Any, out: Any, backend: str, **kw: Any) -> Any:
    import dask.array as da

    x, mask = _dask_arrays(x, mask, out)
    if stats is None:
        stats = _dask_moments(x, mask, backend)
    st = da.stack([f if any_dask(f) else da.asarray(np.asarray(f, dtype=_F8)) for f in stats]).astype(_F8)
    if st.shape != (3,):
        raise ValueError("moments fields must be scalars or 0-d arrays")
    ind = tuple(f"i{k}" for k in range(x.ndim))
    dtype = v.data_dtype(x)
    return da.blockwise(_whiten_block, ind, x, ind, mask, None if mask is None else ind, st.rechunk(-1), ("s",),
                        concatenate=True, dtype=dtype, meta=np.empty((0,) * x.ndim, dtype), backend=backend, **kw)


def _group_block(s: Any, g: Any, **kw: Any) -> Any:
    return group_normalize(s, groups=g, **kw)


def _dask_group_normalize(scores: Any, groups: Any, group_size: Any, out: Any, backend: str, **kw: Any) -> Any:
    import dask.array as da

    from .backends.dask import chunk_libraries

    if out is not None:
        raise TypeError("out= is not supported with Dask arrays: the result is a new lazy array")
    chunk_libraries({"scores": scores, "groups": groups})
    s = scores if any_dask(scores) else da.asarray(scores)
    g = None if groups is None else (groups if any_dask(groups) else da.asarray(groups))
    _check_groups(s, g, group_size)
    dtype = v.data_dtype(s)
    if g is None:
        return s.rechunk(-1).map_blocks(_group_block, None, dtype=dtype, meta=np.empty(0, dtype),
                                        group_size=group_size, backend=backend, **kw)
    return da.map_blocks(_group_block, s.rechunk(-1), g.rechunk(-1), dtype=dtype, meta=np.empty(0, dtype),
                         backend=backend, **kw)
