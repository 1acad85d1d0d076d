"""Finding engines: built-ins, plugin directories and registered plugins.

Resolution order for ``context.engine: NAME`` (seed 003):

1. a plugin directory ``plugins/context_engine/NAME/`` (``plugin.yaml`` + ``__init__.py``
   exporting a :class:`ContextEngine` subclass), searched in ``./plugins``, the user config
   directory, and each ``plugins.dirs`` entry;
2. engines registered by general plugins: entry points in the group ``ctxengine.plugins``
   whose ``register(ctx)`` calls ``ctx.register_context_engine(engine)`` (or, for code that
   never ships as a package, :func:`EngineRegistry.register_plugin` in-process); entry points
   in ``ctxengine.engines`` may also point straight at an engine class;
3. the built-ins: ``compressor``, ``rules``, ``lcm``, ``cacheaware``.

Only one engine is active at a time and plugins are never auto-activated: registering makes an
engine *selectable*, the config selects it. The default name ``compressor`` always means the
built-in (as in seed 003), so a plugin that names its engine ``compressor`` cannot take over
the default; it is reported as a problem. A second plugin registering a context engine is
rejected with a warning. A broken plugin is reported with its path and error and does not take
the others down. An unknown name raises :class:`ConfigError` listing the known ones.

Every engine — built-in, plugin class, plugin directory — is one :class:`Registration`: a name,
where it comes from, and the engine class (the built-ins as ``module:Class``, one line each in
:data:`ctxengine.engines.BUILTINS`, imported on first use). Its construction shape is read once,
where it is registered (:func:`adapt`): the contract's ``from_config(settings, services)``, the
seed's ``from_config(config, context_length, **services)``, or a plain constructor
(``cls(context_length=...)``, as Hermes builds engines). Engines are built per session
(:meth:`EngineRegistry.create`, called by the manager for each new session) with their
settings validated by their ``Settings`` model from the config section named after the engine
(``compressor:``, ``rules:`` …; the seeds' ``compression:`` / ``compaction:`` are aliases, see
:data:`ctxengine.config.SECTION_ALIASES`) and the session's
:class:`~ctxengine.engine.Services`; an engine a plugin registered as an instance is copied for
each session, never shared. Whatever a plugin does while being imported or built — raise, or
call ``sys.exit`` — becomes :class:`~ctxengine.errors.EngineStartError` naming it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import logging
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ctxengine.config import Config
from ctxengine.engine import ContextEngine, Services, keyword_names
from ctxengine.engines import BUILTINS
from ctxengine.errors import ConfigError, EngineStartError, PluginError
from ctxengine.tokens import get_counter

__all__ = [
    "BUILTIN_ENGINES",
    "DEFAULT_ENGINE",
    "EngineRegistry",
    "PluginContext",
    "PluginProblem",
    "Registration",
    "adapt",
    "builds_from_settings",
    "compress_takes_focus",
    "create_engine",
    "default_registry",
    "settings_for",
]

log = logging.getLogger("ctxengine.registry")

BUILTIN_ENGINES: dict[str, str] = BUILTINS
"""The built-in engines (name -> ``module:Class``), one line each in :mod:`ctxengine.engines`."""

DEFAULT_ENGINE = "compressor"
"""The engine used when ``context.engine`` is not set; always the built-in, never a plugin."""

PLUGIN_GROUP = "ctxengine.plugins"
ENGINE_GROUP = "ctxengine.engines"


@dataclass(frozen=True, slots=True)
class PluginProblem:
    """A plugin that failed to load: where it lives and what went wrong."""

    source: str
    error: str

    def __str__(self) -> str:
        return f"{self.source}: {self.error}"


class PluginContext:
    """What a general plugin's ``register(ctx)`` receives."""

    def __init__(self, registry: EngineRegistry, source: str) -> None:
        self._registry = registry
        self.source = source

    def register_context_engine(self, engine: ContextEngine) -> None:
        """Offer ``engine`` for selection by its ``name``. Only one plugin engine is accepted."""
        self._registry._accept_plugin_engine(engine, self.source)


# -- the one adapter: every engine shape becomes build(settings, services) ------------------------
Builder = Callable[[BaseModel | None, Services], Any]
"""How a registered engine is built for one session: ``build(settings, services)``."""

_SEED_SERVICES = ("store", "counter", "summarizer", "recall", "reach")
"""The services a seed-style ``from_config(config, context_length, **services)`` may receive."""

_NAMED_ONLY = frozenset({"reach"})
"""Services newer than the seed: passed to a seed-style ``from_config`` only when it names them
(one taking ``**services`` may hand them on to a constructor that refuses unknown keywords)."""


def builds_from_settings(factory: Any) -> bool:
    """True when ``factory`` builds with ``from_config(settings, services)`` (the ABC's
    default, or an override with those parameters); False for the seed's
    ``from_config(config, context_length, **services)`` and for plain constructors."""
    fc = getattr(factory, "from_config", None)
    if not callable(fc):
        return False
    if getattr(fc, "__func__", None) is getattr(ContextEngine.from_config, "__func__", None):
        return True
    try:
        params = list(inspect.signature(fc).parameters.values())
    except (TypeError, ValueError):
        return False
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not names and any(p.kind is p.VAR_POSITIONAL for p in params):
        return True  # ``from_config(*args, **kwargs)``: takes (settings, services) positionally
    return names[:2] == ["settings", "services"]


def adapt(factory: Any) -> Builder:
    """``build(settings, services)`` for ``factory``, its shape read once, where it is registered.

    The shapes: ``from_config(settings, services)`` (the contract); the seed's
    ``from_config(config, context_length, **services)`` (the whole config, the window and the
    services it names); a plain constructor (``cls(context_length=...)`` when it takes the
    window, else ``cls()``), as Hermes builds its engines.
    """
    fc: Any = getattr(factory, "from_config", None)
    if builds_from_settings(factory):
        return lambda settings, services: fc(settings, services)
    if callable(fc):
        names = keyword_names(fc)

        def seed(settings: BaseModel | None, services: Services) -> Any:
            offered = {k: getattr(services, k) for k in _SEED_SERVICES if getattr(services, k) is not None}
            kw = {k: v for k, v in offered.items() if (k in names if names is not None else k not in _NAMED_ONLY)}
            return fc(services.config, context_length=services.context_length, **kw)

        return seed
    names = keyword_names(factory)
    if names is None or "context_length" in names:
        return lambda settings, services: factory(context_length=services.context_length)
    return lambda settings, services: factory()


@functools.cache
def compress_takes_focus(cls: type) -> bool:
    """True when ``cls.compress`` accepts ``focus_topic`` (the seed's engines may not)."""
    names = keyword_names(getattr(cls, "compress", None))
    return names is None or "focus_topic" in names


def settings_for(factory: Any, config: Config, name: str) -> BaseModel | None:
    """The engine's settings, validated by its :attr:`ContextEngine.Settings` model from the
    config section named after the engine (``config_section`` when an engine names another);
    ``None`` for an engine without a settings model. A config's ``engine_settings(name)`` hook,
    when it has one, supplies the raw section."""
    model = getattr(factory, "Settings", None)
    if model is None:
        return None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"engine {name!r}: Settings must be a pydantic model class, not {model!r}")
    hook = getattr(config, "engine_settings", None)
    section = getattr(factory, "config_section", None) or name
    raw = hook(name) if callable(hook) else getattr(config, section, None)
    if isinstance(raw, model):
        return raw
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        raise ConfigError(f"engine {name!r}: invalid settings in {section!r}: {exc}") from exc


@dataclass(slots=True)
class Registration:
    """One selectable engine: its name, where it comes from, and how it is built.

    ``target`` is the engine class (or any callable returning an engine), or ``"module:attr"``
    imported on first use (the built-ins). Its shape is adapted once (:func:`adapt`).
    """

    name: str
    target: Any
    source: str = "built-in"
    _factory: Any = field(default=None, init=False, repr=False)
    _build: Builder | None = field(default=None, init=False, repr=False)

    def factory(self) -> Any:
        if self._factory is None:
            target = self.target
            if isinstance(target, str):
                modname, _, attr = target.partition(":")
                try:
                    target = getattr(importlib.import_module(modname), attr)
                except (ImportError, AttributeError) as exc:
                    raise ConfigError(f"built-in engine {self.name!r} is not available: {exc}") from exc
            self._factory = target
        return self._factory

    def build(self, config: Config, services: Services) -> ContextEngine:
        factory = self.factory()
        if self._build is None:
            self._build = adapt(factory)
        engine = self._build(settings_for(factory, config, self.name), services)
        if not isinstance(engine, ContextEngine):
            raise PluginError(f"{factory!r} produced a {type(engine).__name__}, not a ContextEngine")
        return engine


def _mark_source(engine: ContextEngine, source: str | None) -> None:
    """Remember where a plugin engine comes from, so errors can name it."""
    if source and source != "built-in":
        with contextlib.suppress(AttributeError, TypeError):  # a slotted engine: errors name it without source
            engine._ctxengine_source = source  # type: ignore[attr-defined]


class EngineRegistry:
    """Knows every selectable engine and builds the configured one."""

    def __init__(self, *, plugin_dirs: Iterable[str | Path] = (), entry_points: bool = True) -> None:
        self._plugin_engine: tuple[ContextEngine, str] | None = None
        self._engines: dict[str, Registration] = {}
        for name, target in BUILTIN_ENGINES.items():  # the built-ins: registered like plugins
            self._engines[name] = Registration(name, target)
        self.problems: list[PluginProblem] = []
        self._plugin_dirs = [Path(d) for d in plugin_dirs]
        self._entry_points_loaded = not entry_points

    # -- registration ------------------------------------------------------------------------
    def register_plugin(self, register: Callable[[PluginContext], Any], source: str = "<in-process>") -> None:
        """Run a general plugin's ``register(ctx)`` in-process (what entry points do)."""
        try:
            register(PluginContext(self, source))
        except (Exception, SystemExit) as exc:  # a broken plugin must not take the others down
            self._problem(source, exc)

    def register_engine_class(self, name: str, factory: Any, source: str = "<in-process>") -> None:
        """Make an engine class selectable under ``name`` (plugins; built-ins use the same path)."""
        if name == DEFAULT_ENGINE:
            self._problem(source, PluginError(f"the engine name {name!r} is reserved for the built-in default"))
            return
        known = self._engines.get(name)
        if known is not None and known.source != "built-in":
            warnings.warn(f"context engine {name!r} from {source} rejected: already registered by {known.source}", stacklevel=2)
            return
        self._engines[name] = Registration(name, factory, source)  # a plugin class beats a built-in

    def _accept_plugin_engine(self, engine: ContextEngine, source: str) -> None:
        if not isinstance(engine, ContextEngine):
            raise PluginError(f"{source}: register_context_engine() needs a ContextEngine, got {type(engine).__name__}")
        if engine.name == DEFAULT_ENGINE:
            raise PluginError(f"{source}: the engine name {DEFAULT_ENGINE!r} is reserved for the built-in default")
        if self._plugin_engine is not None:
            other = self._plugin_engine[1]
            msg = f"context engine {engine.name!r} from {source} rejected: only one plugin engine may register ({self._plugin_engine[0].name!r} from {other} already did)"
            log.warning(msg)
            warnings.warn(msg, stacklevel=3)
            return
        self._plugin_engine = (engine, source)

    def _problem(self, source: str, exc: BaseException) -> None:
        problem = PluginProblem(source, f"{type(exc).__name__}: {exc}")
        self.problems.append(problem)
        log.warning("plugin failed to load: %s", problem)

    # -- discovery ------------------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for group in (PLUGIN_GROUP, ENGINE_GROUP):
            for ep in metadata.entry_points(group=group):
                source = f"entry point {ep.name} ({ep.value}){_dist_where(ep)}"
                try:
                    obj = ep.load()
                except (Exception, SystemExit) as exc:  # sys.exit() on import must not end the host
                    self._problem(source, exc)
                    continue
                if group == ENGINE_GROUP:
                    self.register_engine_class(ep.name, obj, source)
                    continue
                register = getattr(obj, "register", obj)
                if not callable(register):
                    self._problem(source, PluginError("has no register(ctx) function"))
                    continue
                self.register_plugin(register, source)

    def plugin_dirs(self) -> list[Path]:
        """Directories searched for ``context_engine/<name>/`` plugins, in order."""
        dirs = [*self._plugin_dirs, Path.cwd() / "plugins"]
        try:
            import platformdirs

            dirs.append(Path(platformdirs.user_config_dir("ctxengine")) / "plugins")
        except ImportError:  # pragma: no cover - platformdirs is a core dependency
            pass
        return dirs

    def _dir_plugin(self, name: str) -> Any | None:
        for base in self.plugin_dirs():
            d = base / "context_engine" / name
            if not (d / "__init__.py").is_file():
                continue
            try:
                return self._load_dir_plugin(d, name)
            except (Exception, SystemExit) as exc:  # sys.exit() on import must not end the host
                self._problem(str(d), exc)
                raise EngineStartError(f"plugin {name!r} at {d} failed to load: {type(exc).__name__}: {exc}") from exc
        return None

    def _load_dir_plugin(self, d: Path, name: str) -> Any:
        manifest = d / "plugin.yaml"
        if manifest.is_file():
            meta = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
            if not isinstance(meta, dict):
                raise PluginError(f"{manifest}: must be a mapping")
        modname = f"ctxengine_plugin_{name.replace('-', '_')}"
        spec = importlib.util.spec_from_file_location(modname, d / "__init__.py", submodule_search_locations=[str(d)])
        if spec is None or spec.loader is None:
            raise PluginError(f"{d}: cannot import")
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(modname, None)  # a half-imported plugin must not be found later
            raise
        classes = [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, ContextEngine) and obj is not ContextEngine and not inspect.isabstract(obj)
        ]
        # A plugin often imports a built-in engine to subclass it: prefer the plugin's own class.
        own = [c for c in classes if c.__module__ == modname or c.__module__.startswith(modname + ".")]
        if not (own or classes):
            raise PluginError(f"{d / '__init__.py'} exports no ContextEngine subclass")
        return (own or classes)[0]

    def _dir_plugin_names(self) -> list[str]:
        names = []
        for base in self.plugin_dirs():
            root = base / "context_engine"
            if root.is_dir():
                names += [p.name for p in root.iterdir() if (p / "__init__.py").is_file()]
        return names

    def names(self) -> list[str]:
        """Every selectable engine name (plugin directories, registered plugins, built-ins)."""
        self._load_entry_points()
        names = set(self._engines) | set(self._dir_plugin_names())
        if self._plugin_engine is not None:
            names.add(self._plugin_engine[0].name)
        return sorted(names)

    def describe(self) -> list[dict[str, str]]:
        """One row per engine: name and where it comes from (for ``ctxengine engines``)."""
        self._load_entry_points()
        rows: dict[str, str] = {n: r.source for n, r in self._engines.items()}
        if self._plugin_engine is not None:
            rows[self._plugin_engine[0].name] = self._plugin_engine[1]
        for n in self._dir_plugin_names():
            if n != DEFAULT_ENGINE:  # never used for the default (see create)
                rows[n] = "plugin directory"
        return [{"name": n, "source": rows[n]} for n in sorted(rows)]

    # -- creation ---------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        config: Config | None = None,
        *,
        context_length: int | None = None,
        services: Services | None = None,
        **given: Any,
    ) -> ContextEngine:
        """Build a fresh engine ``name`` for one session, following the resolution order.

        Every engine is built by ``build(settings, services)`` (:func:`adapt` turned its shape
        into that once): its settings validated from the config section named after it, the
        session's ``services`` (a :class:`~ctxengine.engine.Services`; keyword services such as
        ``store=`` or ``summarizer=`` are accepted too and replace the ones in ``services``).
        An engine a plugin registered as an instance is copied for each call, so no two
        sessions share one. Whatever goes wrong while importing or building a plugin —
        ``SystemExit`` included — is an :class:`~ctxengine.errors.EngineStartError` naming it.
        """
        config = config or Config()
        n = context_length or (services.context_length if services is not None else None) or config.model.context_length or config.model.default_context_length
        services = _session_services(services, given, config, n)
        # the default is always the built-in: plugins are never auto-activated (seed 003)
        factory = None if name == DEFAULT_ENGINE else self._dir_plugin(name)
        if factory is not None:
            reg = Registration(name, factory, f"plugin directory context_engine/{name}")
        else:
            self._load_entry_points()
            if self._plugin_engine is not None and self._plugin_engine[0].name == name:
                return self._copy_plugin_engine(name, config, n, context_length is not None)
            found = self._engines.get(name)
            if found is None:
                raise ConfigError(f"unknown context engine {name!r}; known engines: {', '.join(self.names())}")
            reg = found
        try:
            engine = reg.build(config, services)
        except (ConfigError, PluginError):
            raise
        except (Exception, SystemExit) as exc:  # a plugin's sys.exit() must not end the host
            where = "" if reg.source == "built-in" else f" (from {reg.source})"
            raise EngineStartError(f"engine {name!r}{where} failed to start: {type(exc).__name__}: {exc}") from exc
        _mark_source(engine, reg.source)
        return engine

    def _copy_plugin_engine(self, name: str, config: Config, n: int, resize: bool) -> ContextEngine:
        assert self._plugin_engine is not None
        prototype, source = self._plugin_engine
        try:
            engine = copy.deepcopy(prototype)
        except Exception as exc:
            raise EngineStartError(
                f"engine {name!r} (from {source}) cannot be copied for a new session ({type(exc).__name__}: {exc}); "
                "register an engine class (register_engine_class) so each session gets its own instance"
            ) from exc
        if resize:
            engine.update_model(config.model.default or "", n)
        _mark_source(engine, source)
        return engine


def _session_services(services: Services | None, given: dict[str, Any], config: Config, n: int) -> Services:
    """The services an engine is built with: ``services`` (or the defaults), the keyword
    services ``given`` on top, the window ``n``, the config, and the configured counter."""
    fields = set(Services.__slots__)
    unknown = sorted(set(given) - fields)
    if unknown:
        raise TypeError(f"unknown service(s) {', '.join(unknown)}; services are {', '.join(sorted(fields))}")
    out = dataclasses.replace(services if services is not None else Services(), **given)
    out.context_length = n
    if out.config is None:
        out.config = config
    if out.counter is None:  # context.token_counter reaches every engine
        out.counter = get_counter(config.context.token_counter)
    return out


def _dist_where(ep: metadata.EntryPoint) -> str:
    """`` of <distribution> <version> at <path>`` for an entry point, so a broken plugin can be
    found on disk; empty when the metadata does not say."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ""
    try:
        where = str(dist.locate_file(""))
    except Exception:  # pragma: no cover - exotic distribution finders
        where = "?"
    return f" of {dist.metadata['Name']} {dist.version} at {where}"


_DEFAULT: EngineRegistry | None = None


def default_registry() -> EngineRegistry:
    """The process-wide registry (entry points loaded on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = EngineRegistry()
    return _DEFAULT


def create_engine(config: Config | None = None, *, name: str | None = None, context_length: int | None = None, registry: EngineRegistry | None = None, **services: Any) -> ContextEngine:
    """Build the engine selected by ``config.context.engine`` (or ``name``)."""
    config = config or Config()
    reg = registry or EngineRegistry(plugin_dirs=config.plugins.dirs, entry_points=config.plugins.entry_points)
    return reg.create(name or config.context.engine, config, context_length=context_length, **services)
