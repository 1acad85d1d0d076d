"""The built-in engines, registered like plugins: one module and one line each.

``BUILTINS`` maps an engine's name to its class (``module:Class``, imported on first use); the
registry (:mod:`ctxengine.registry`) registers each of them through the same path as a plugin
engine class, and the engine's settings are the config section of the same name, validated by
the engine's ``Settings`` model. A new built-in engine is a module here and a line below.
"""

BUILTINS: dict[str, str] = {
    "compressor": "ctxengine.engines.compressor:ContextCompressor",
    "rules": "ctxengine.engines.rules:RulesEngine",
    "lcm": "ctxengine.engines.lcm:LcmEngine",
    "cacheaware": "ctxengine.engines.cacheaware:CacheAwareEngine",
}
"""Engine name -> ``module:Class``; ``compressor`` is the default (``context.engine``)."""

__all__ = ["BUILTINS"]
