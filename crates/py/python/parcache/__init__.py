"""parcache from Python (docs/advisor.md, "Python").

The simulator and the advisor run the same code as ``parcache sim`` and
``parcache advise`` and return plain dicts; ``frame`` turns a list of rows
into a pandas DataFrame (``pip install parcache[pandas]``). ``Client`` reads
and writes files of a running cluster without a mount.
"""

from ._native import Client, advise, replay, run_scenario, scenarios

__all__ = ["Client", "advise", "replay", "run_scenario", "scenarios", "flatten", "frame"]


def flatten(row, prefix=""):
    """One row's nested dicts as one flat dict: ``{"outcome": {"elapsed": 1}}``
    becomes ``{"elapsed": 1}``, ``{"policies": {"write": ...}}`` becomes
    ``{"write": ...}`` (a key met twice keeps its prefix)."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            for k2, v2 in flatten(v).items():
                out[k2 if k2 not in out and k2 not in row else f"{k}.{k2}"] = v2
        else:
            out[prefix + k] = v
    return out


def frame(rows):
    """A pandas DataFrame of rows (``advise(...)["ranked"]``,
    ``run_scenario(...)["rows"]``, a list of ``replay`` results), nested
    dicts flattened into columns."""
    try:
        import pandas
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("parcache.frame needs pandas: pip install 'parcache[pandas]'") from e
    return pandas.DataFrame([flatten(r) for r in rows])
