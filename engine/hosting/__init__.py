"""Several models in one process (``ModelHost``): loaded on demand, kept while used,
unloaded when idle past their keep-alive or when another needs the memory budget; and
the library of models a server answers for (``library.py``)."""

from engine.hosting.host import HostedModel, ModelHost, ModelLease, ModelWontFit
from engine.hosting.keep_alive import parse_keep_alive

__all__ = ["HostedModel", "ModelHost", "ModelLease", "ModelWontFit", "parse_keep_alive"]
