"""ctxengine.registry: resolution order, general plugins, entry points (real dist-info), failures.

Entry points are tested for real: each test writes a tiny ``*.dist-info`` with an
``entry_points.txt`` and the plugin module into a temporary directory put on ``sys.path``,
where ``importlib.metadata`` finds it. Plugin directories are real folders. No mocks.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
import warnings
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from ctxengine.config import Config
from ctxengine.engine import ContextEngine
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.errors import ConfigError, PluginError
from ctxengine.registry import (
    DEFAULT_ENGINE,
    EngineRegistry,
    PluginContext,
    create_engine,
)

ENGINE_SRC = '''
from ctxengine.engine import ContextEngine


class {cls}(ContextEngine):
    origin = "{origin}"

    def __init__(self, context_length=128_000, **kwargs):
        super().__init__(context_length=context_length)
        self.kwargs = kwargs

    @property
    def name(self):
        return "{name}"

    def update_from_response(self, usage):
        self._record_usage(usage)

    def should_compress(self, prompt_tokens=None):
        return False

    def compress(self, messages, current_tokens=None, focus_topic=None):
        return list(messages)
'''


def engine_source(name: str, origin: str, cls: str = "PluginEngine") -> str:
    return ENGINE_SRC.format(name=name, origin=origin, cls=cls)


class InProcessEngine(ContextEngine):
    """An engine defined by the test itself (general plugin registered in-process)."""

    def __init__(self, name: str = "inproc", context_length: int = 128_000) -> None:
        super().__init__(context_length=context_length)
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None, focus_topic: str | None = None) -> list[dict[str, Any]]:
        return list(messages)


# -- fixtures: plugin directories and installed distributions -------------------------------------


@pytest.fixture
def plugin_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``./plugins`` of a fresh working directory (the default search place)."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "plugins"
    (root / "context_engine").mkdir(parents=True)
    return root


def make_dir_plugin(root: Path, name: str, init: str, manifest: str | None = None) -> Path:
    d = root / "context_engine" / name
    d.mkdir(parents=True)
    (d / "__init__.py").write_text(textwrap.dedent(init), encoding="utf-8")
    (d / "plugin.yaml").write_text(manifest if manifest is not None else f"name: {name}\ndescription: test\nversion: 0.1\n", encoding="utf-8")
    return d


class Dists:
    """Writes installed distributions (``*.dist-info``) into a directory on ``sys.path``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def add(self, entry_points: dict[str, dict[str, str]], modules: dict[str, str]) -> None:
        """``entry_points``: group -> {name: "module:attr"}; ``modules``: short name -> source.

        Module names are made unique per test (``sys.modules`` outlives a test); use
        ``{mod:short}`` in entry point values to refer to them.
        """
        real = {short: f"ctxe_test_{short}_{uuid.uuid4().hex[:8]}" for short in modules}
        for short, src in modules.items():
            (self.root / f"{real[short]}.py").write_text(textwrap.dedent(src), encoding="utf-8")
            self.modules.append(real[short])
        dist = f"ctxe_test_dist_{uuid.uuid4().hex[:8]}"
        info = self.root / f"{dist}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n", encoding="utf-8")
        lines = []
        for group, eps in entry_points.items():
            lines.append(f"[{group}]")
            for ep_name, value in eps.items():
                for short, full in real.items():
                    value = value.replace(f"{{mod:{short}}}", full)
                lines.append(f"{ep_name} = {value}")
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def dists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dists]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    d = Dists(root)
    yield d
    for mod in d.modules:
        sys.modules.pop(mod, None)


def general_plugin(name: str, origin: str = "entry point") -> str:
    return engine_source(name, origin) + "\n\ndef register(ctx):\n    ctx.register_context_engine(PluginEngine(context_length=64_000))\n"


def origin(engine: ContextEngine) -> str:
    return str(getattr(engine, "origin", "built-in"))


# -- the real-dist-info machinery works ------------------------------------------------------------


def test_written_dist_info_is_found_by_importlib_metadata(dists: Dists) -> None:
    dists.add({"ctxengine.plugins": {"probe": "{mod:probe}:register"}}, {"probe": general_plugin("probe")})
    eps = [ep for ep in metadata.entry_points(group="ctxengine.plugins") if ep.name == "probe"]
    assert len(eps) == 1
    assert callable(eps[0].load())


# -- built-ins and the default -----------------------------------------------------------------------


def test_builtin_default_is_the_compressor() -> None:
    reg = EngineRegistry(entry_points=False)
    engine = reg.create(DEFAULT_ENGINE)
    assert DEFAULT_ENGINE == "compressor"
    assert type(engine) is ContextCompressor
    assert engine.name == "compressor"
    assert {"compressor", "rules", "lcm"} <= set(reg.names())


def test_create_engine_uses_config_and_context_length() -> None:
    reg = EngineRegistry(entry_points=False)
    engine = create_engine(Config(), registry=reg, context_length=50_000)
    assert engine.name == "compressor"
    assert engine.context_length == 50_000
    # digests (the default mode) fold old turns from their own threshold, 0.55 of the window
    assert engine.threshold_tokens == 27_500
    summary = Config()
    summary.compression.mode = "summary"
    assert create_engine(summary, registry=reg, context_length=50_000).threshold_tokens == 25_000  # compression.threshold 0.50


# -- resolution order --------------------------------------------------------------------------------


def test_dir_plugin_beats_entry_point_beats_builtin(plugin_root: Path, dists: Dists) -> None:
    # "lcm" is a built-in name; an entry-point plugin and a plugin directory also offer it
    dists.add({"ctxengine.plugins": {"lcm-plugin": "{mod:gp}:register"}}, {"gp": general_plugin("lcm")})
    reg = EngineRegistry()
    assert origin(reg.create("lcm")) == "entry point"  # entry point beats the built-in
    make_dir_plugin(plugin_root, "lcm", engine_source("lcm", "plugin directory"))
    assert origin(reg.create("lcm")) == "plugin directory"  # plugin directory beats both
    assert reg.problems == []


def test_entry_point_engine_class_beats_builtin(dists: Dists) -> None:
    dists.add({"ctxengine.engines": {"rules": "{mod:ec}:PluginEngine"}}, {"ec": engine_source("rules", "engine class")})
    reg = EngineRegistry()
    engine = reg.create("rules", context_length=10_000)
    assert origin(engine) == "engine class"
    assert engine.context_length == 10_000
    assert any(row == {"name": "rules", "source": row["source"]} and "entry point rules" in row["source"] for row in reg.describe())


def test_dir_plugin_loads_from_cwd_plugins(plugin_root: Path) -> None:
    d = make_dir_plugin(plugin_root, "mine", engine_source("mine", "plugin directory"))
    reg = EngineRegistry(entry_points=False)
    assert "mine" in reg.names()
    engine = reg.create("mine", context_length=42_000)
    assert engine.name == "mine" and engine.context_length == 42_000
    assert {"name": "mine", "source": "plugin directory"} in reg.describe()
    assert reg.plugin_dirs()[0] == d.parents[1]


def test_dir_plugin_from_configured_dirs(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    make_dir_plugin(extra, "far", engine_source("far", "configured dir"))
    cfg = Config.from_dict({"context": {"engine": "far"}, "plugins": {"dirs": [str(extra)], "entry_points": False}})
    engine = create_engine(cfg)
    assert engine.name == "far" and origin(engine) == "configured dir"


def test_dir_plugin_in_a_package_with_submodules(plugin_root: Path) -> None:
    d = make_dir_plugin(plugin_root, "pkg", "from .engine import PluginEngine\n")
    (d / "engine.py").write_text(engine_source("pkg", "submodule"), encoding="utf-8")
    assert origin(EngineRegistry(entry_points=False).create("pkg")) == "submodule"


def test_dir_plugin_subclassing_a_builtin_gets_its_own_class(plugin_root: Path) -> None:
    make_dir_plugin(
        plugin_root,
        "tuned",
        """
        from ctxengine.engines.compressor import ContextCompressor


        class Tuned(ContextCompressor):
            origin = "subclass"

            @property
            def name(self):
                return "tuned"
        """,
    )
    engine = EngineRegistry(entry_points=False).create("tuned")
    assert type(engine).__name__ == "Tuned"
    assert engine.name == "tuned" and origin(engine) == "subclass"


def test_plugin_dir_without_plugin_yaml_still_loads(plugin_root: Path) -> None:
    d = make_dir_plugin(plugin_root, "bare", engine_source("bare", "no manifest"))
    (d / "plugin.yaml").unlink()
    assert origin(EngineRegistry(entry_points=False).create("bare")) == "no manifest"


# -- general plugins: register(ctx) ----------------------------------------------------------------


def test_general_plugin_in_process() -> None:
    reg = EngineRegistry(entry_points=False)
    engine = InProcessEngine("inproc")
    seen: list[PluginContext] = []

    def register(ctx: PluginContext) -> None:
        seen.append(ctx)
        ctx.register_context_engine(engine)

    reg.register_plugin(register, source="my-plugin")
    assert seen[0].source == "my-plugin"
    # each session gets its own copy of the registered instance, never the instance itself
    first, second = reg.create("inproc"), reg.create("inproc")
    assert isinstance(first, type(engine)) and first.name == "inproc"
    assert first is not engine and second is not first
    assert "inproc" in reg.names()
    assert {"name": "inproc", "source": "my-plugin"} in reg.describe()


def test_general_plugin_via_entry_point(dists: Dists) -> None:
    dists.add({"ctxengine.plugins": {"gp": "{mod:gp}:register"}}, {"gp": general_plugin("gp-engine")})
    reg = EngineRegistry()
    engine = reg.create("gp-engine")
    assert engine.name == "gp-engine"
    assert engine.context_length == 64_000  # as the plugin built it
    assert reg.create("gp-engine", context_length=20_000).context_length == 20_000  # update_model


def test_general_plugin_entry_point_may_name_a_module(dists: Dists) -> None:
    dists.add({"ctxengine.plugins": {"gp": "{mod:gp}"}}, {"gp": general_plugin("modlevel")})
    assert EngineRegistry().create("modlevel").name == "modlevel"


def test_second_registration_is_rejected_with_a_warning(dists: Dists) -> None:
    reg = EngineRegistry(entry_points=False)
    first, second = InProcessEngine("first"), InProcessEngine("second")
    reg.register_plugin(lambda ctx: ctx.register_context_engine(first), "plugin-a")
    with pytest.warns(UserWarning, match=r"'second' from plugin-b rejected.*'first' from plugin-a"):
        reg.register_plugin(lambda ctx: ctx.register_context_engine(second), "plugin-b")
    assert reg.create("first").name == "first"
    assert "second" not in reg.names()
    with pytest.raises(ConfigError, match="unknown context engine 'second'"):
        reg.create("second")


def test_second_entry_point_plugin_is_rejected(dists: Dists) -> None:
    dists.add({"ctxengine.plugins": {"a": "{mod:a}:register"}}, {"a": general_plugin("ep-a")})
    dists.add({"ctxengine.plugins": {"b": "{mod:b}:register"}}, {"b": general_plugin("ep-b")})
    reg = EngineRegistry()
    with pytest.warns(UserWarning, match="only one plugin engine may register"):
        names = reg.names()
    assert len({"ep-a", "ep-b"} & set(names)) == 1


def test_second_engine_class_with_same_name_is_rejected() -> None:
    reg = EngineRegistry(entry_points=False)
    reg.register_engine_class("dup", InProcessEngine, "one")
    with pytest.warns(UserWarning, match="'dup' from two rejected"):
        reg.register_engine_class("dup", InProcessEngine, "two")
    assert {"name": "dup", "source": "one"} in reg.describe()


# -- never auto-activated ------------------------------------------------------------------------------


def test_plugins_are_never_auto_activated(plugin_root: Path, dists: Dists) -> None:
    make_dir_plugin(plugin_root, "dirplug", engine_source("dirplug", "plugin directory"))
    dists.add({"ctxengine.plugins": {"gp": "{mod:gp}:register"}}, {"gp": general_plugin("epplug")})
    reg = EngineRegistry()
    reg.register_plugin(lambda ctx: None, "does nothing")
    assert {"dirplug", "epplug"} <= set(reg.names())
    engine = create_engine(Config(), registry=reg)
    assert type(engine) is ContextCompressor


def test_a_plugin_cannot_take_over_the_default_name(plugin_root: Path, dists: Dists) -> None:
    make_dir_plugin(plugin_root, "compressor", engine_source("compressor", "plugin directory"))
    dists.add({"ctxengine.plugins": {"gp": "{mod:gp}:register"}}, {"gp": general_plugin("compressor")})
    dists.add({"ctxengine.engines": {"compressor": "{mod:ec}:PluginEngine"}}, {"ec": engine_source("compressor", "engine class")})
    reg = EngineRegistry()
    engine = reg.create("compressor")
    assert type(engine) is ContextCompressor
    assert len(reg.problems) == 2
    assert all("reserved" in p.error for p in reg.problems)
    assert any("entry point gp" in p.source for p in reg.problems)
    assert any("entry point compressor" in p.source for p in reg.problems)
    assert {"name": "compressor", "source": "built-in"} in reg.describe()


# -- unknown names ----------------------------------------------------------------------------------------


def test_unknown_engine_lists_the_known_names(plugin_root: Path) -> None:
    make_dir_plugin(plugin_root, "dirplug", engine_source("dirplug", "plugin directory"))
    reg = EngineRegistry(entry_points=False)
    reg.register_plugin(lambda ctx: ctx.register_context_engine(InProcessEngine("inproc")))
    with pytest.raises(ConfigError) as info:
        reg.create("nope")
    msg = str(info.value)
    assert "unknown context engine 'nope'" in msg
    for name in ("compressor", "rules", "lcm", "dirplug", "inproc"):
        assert name in msg


def test_unknown_engine_via_config() -> None:
    cfg = Config.from_dict({"context": {"engine": "zzz"}, "plugins": {"entry_points": False}})
    with pytest.raises(ConfigError, match=r"known engines: .*compressor"):
        create_engine(cfg)


# -- broken plugins are reported and do not take the others down -----------------------------------------


def test_syntax_error_in_dir_plugin(plugin_root: Path) -> None:
    bad = make_dir_plugin(plugin_root, "broken", "def oops(:\n    pass\n")
    make_dir_plugin(plugin_root, "good", engine_source("good", "plugin directory"))
    reg = EngineRegistry(entry_points=False)
    with pytest.raises(PluginError) as info:
        reg.create("broken")
    assert str(bad) in str(info.value) and "SyntaxError" in str(info.value)
    assert [p.source for p in reg.problems] == [str(bad)]
    assert "SyntaxError" in reg.problems[0].error
    assert "ctxengine_plugin_broken" not in sys.modules
    # the others still load
    assert reg.create("good").name == "good"
    assert type(reg.create("compressor")) is ContextCompressor


def test_dir_plugin_raising_at_import(plugin_root: Path) -> None:
    bad = make_dir_plugin(plugin_root, "boom", "raise RuntimeError('no GPU found')\n")
    reg = EngineRegistry(entry_points=False)
    with pytest.raises(PluginError, match="RuntimeError: no GPU found"):
        reg.create("boom")
    assert str(reg.problems[0]) == f"{bad}: RuntimeError: no GPU found"


@pytest.mark.parametrize(
    ("init", "manifest", "needle"),
    [
        ("x = 1\n", None, "exports no ContextEngine subclass"),
        (engine_source("m", "x"), "- just\n- a list\n", "must be a mapping"),
        (engine_source("m", "x"), "name: [unclosed\n", "YAMLError|ParserError|ScannerError"),
    ],
)
def test_bad_dir_plugins(plugin_root: Path, init: str, manifest: str | None, needle: str) -> None:
    d = make_dir_plugin(plugin_root, "m", init, manifest)
    reg = EngineRegistry(entry_points=False)
    with pytest.raises(PluginError, match=needle) as info:
        reg.create("m")
    assert str(d) in str(info.value)


def test_broken_entry_points_are_reported_and_others_load(dists: Dists) -> None:
    dists.add(
        {
            "ctxengine.plugins": {
                "syntax": "{mod:syntax}:register",
                "raises": "{mod:raises}:register",
                "missing": "ctxe_test_no_such_module_xyz:register",
                "notcallable": "{mod:notcallable}:VALUE",
                "wrongtype": "{mod:wrongtype}:register",
                "good": "{mod:good}:register",
            }
        },
        {
            "syntax": "def register(ctx:\n",
            "raises": "def register(ctx):\n    raise ValueError('bad settings')\n",
            "notcallable": "VALUE = 3\n",
            "wrongtype": "def register(ctx):\n    ctx.register_context_engine('not an engine')\n",
            "good": general_plugin("survivor"),
        },
    )
    reg = EngineRegistry()
    assert reg.create("survivor").name == "survivor"
    problems = {p.source.split(" ")[2]: p.error for p in reg.problems}
    assert set(problems) == {"syntax", "raises", "missing", "notcallable", "wrongtype"}
    assert problems["syntax"].startswith("SyntaxError")
    assert problems["raises"] == "ValueError: bad settings"
    assert problems["missing"].startswith("ModuleNotFoundError")
    assert "register(ctx)" in problems["notcallable"]
    assert "needs a ContextEngine" in problems["wrongtype"]
    # each problem names where the plugin lives: entry point, distribution and its path
    for p in reg.problems:
        assert p.source.startswith("entry point ") and "(" in p.source
        assert " of ctxe_test_dist_" in p.source and f"at {dists.root}" in p.source


def test_broken_engine_class_entry_point(dists: Dists) -> None:
    dists.add({"ctxengine.engines": {"crashy": "{mod:c}:Crashy"}}, {"c": "class Crashy:\n    def __init__(self, context_length):\n        raise OSError('disk full')\n"})
    reg = EngineRegistry()
    with pytest.raises(PluginError, match=r"engine 'crashy' \(from entry point crashy .*\) failed to start: OSError: disk full"):
        reg.create("crashy")
    dists.add({"ctxengine.engines": {"notengine": "{mod:n}:Thing"}}, {"n": "class Thing:\n    pass\n"})
    reg2 = EngineRegistry()
    with pytest.raises(PluginError, match="not a ContextEngine"):
        reg2.create("notengine")


def test_entry_points_can_be_turned_off(dists: Dists) -> None:
    dists.add({"ctxengine.plugins": {"gp": "{mod:gp}:register"}}, {"gp": general_plugin("hidden")})
    cfg = Config.from_dict({"context": {"engine": "hidden"}, "plugins": {"entry_points": False}})
    with pytest.raises(ConfigError, match="unknown context engine 'hidden'"):
        create_engine(cfg)
    assert create_engine(cfg.with_overrides(plugins={"entry_points": True})).name == "hidden"


# -- factories and services ----------------------------------------------------------------------------------


class ConfiguredEngine(InProcessEngine):
    def __init__(self, context_length: int, store: Any = None, summarizer: Any = None) -> None:
        super().__init__("configured", context_length)
        self.store = store
        self.summarizer = summarizer

    @classmethod
    def from_config(cls, config: Config, *, context_length: int, store: Any = None) -> ConfiguredEngine:
        return cls(context_length=context_length, store=store)


def test_from_config_receives_only_the_services_it_accepts() -> None:
    reg = EngineRegistry(entry_points=False)
    reg.register_engine_class("configured", ConfiguredEngine)
    store = object()
    engine = reg.create("configured", context_length=1234, store=store, summarizer="ignored")
    assert isinstance(engine, ConfiguredEngine)
    assert engine.store is store and engine.summarizer is None
    assert engine.context_length == 1234


def test_context_length_from_config_model_section() -> None:
    reg = EngineRegistry(entry_points=False)
    reg.register_engine_class("plain", InProcessEngine)
    cfg = Config.from_dict({"model": {"context_length": 32_000}})
    assert reg.create("plain", cfg).context_length == 32_000
    assert reg.create("plain").context_length == Config().model.default_context_length


def test_no_warning_when_nothing_is_wrong(plugin_root: Path, dists: Dists) -> None:
    make_dir_plugin(plugin_root, "quiet", engine_source("quiet", "plugin directory"))
    dists.add({"ctxengine.plugins": {"gp": "{mod:gp}:register"}}, {"gp": general_plugin("calm")})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg = EngineRegistry()
        assert reg.create("quiet").name == "quiet"
        assert reg.create("calm").name == "calm"
    assert reg.problems == []


# -- per-session construction: from_config(settings, services) ---------------------------------
def test_engines_with_a_settings_model_get_validated_settings_and_the_session_services() -> None:
    from pydantic import BaseModel

    from ctxengine.engine import Services
    from ctxengine.registry import builds_from_settings, settings_for

    class Knobs(BaseModel):
        threshold: float = 0.5
        keep: int = 2

    built: list[tuple[Any, Any]] = []

    class Knobbed(InProcessEngine):
        Settings = Knobs
        config_section = "compaction"  # reads an existing section: only its known fields matter

        def __init__(self, *, context_length: int = 1000, threshold: float | None = None, keep: int = 1) -> None:
            super().__init__("knobbed")
            self.context_length = context_length
            self.keep = keep

        @classmethod
        def from_config(cls, settings: Any, services: Any) -> Knobbed:  # type: ignore[override]
            built.append((settings, services))
            return cls(context_length=services.context_length, keep=settings.keep)

    assert builds_from_settings(Knobbed)  # the ABC default counts too: every engine gets (settings, services)

    class Loose(BaseModel):
        model_config = {"extra": "ignore"}
        trigger_threshold: float = 0.1

    class FromSection(Knobbed):
        Settings = Loose

        @classmethod
        def from_config(cls, settings: Any, services: Any) -> FromSection:  # type: ignore[override]
            built.append((settings, services))
            return cls(context_length=services.context_length)

    cfg = Config.from_dict({"compaction": {"trigger_threshold": 0.42}})
    assert settings_for(FromSection, cfg, "fs").trigger_threshold == 0.42  # type: ignore[union-attr]
    reg = EngineRegistry(entry_points=False)
    reg.register_engine_class("knobbed", Knobbed)
    engine = reg.create("knobbed", Config(), context_length=7000, services=Services(session_id="s9", context_length=7000))
    settings, services = built[-1]
    assert isinstance(settings, Knobs) and services.session_id == "s9" and services.context_length == 7000
    assert engine.context_length == 7000 and engine.keep == 2  # type: ignore[attr-defined]
