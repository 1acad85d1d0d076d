"""One engine shape: every engine is built by ``from_config(settings, services)``; other shapes
are adapted once, where an engine is registered; built-ins are registered like plugins; an
engine's config section is named after it, the seeds' section names kept as aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from ctxengine.config import (
    SECTION_ALIASES,
    CompactionConfig,
    CompressionConfig,
    Config,
    load_config,
)
from ctxengine.engine import ContextEngine, Services
from ctxengine.engines import BUILTINS
from ctxengine.engines.compressor import ContextCompressor
from ctxengine.engines.rules import RulesEngine
from ctxengine.errors import ConfigError
from ctxengine.integrations.hermes.adapter import settings_from_hermes_config
from ctxengine.registry import (
    BUILTIN_ENGINES,
    EngineRegistry,
    Registration,
    adapt,
    compress_takes_focus,
)
from ctxengine.store import SqliteStore


class _Base(ContextEngine):
    def __init__(self, context_length: int = 128_000, **seen: Any) -> None:
        super().__init__(context_length=context_length)
        self.seen = seen

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None, focus_topic: str | None = None) -> list[dict[str, Any]]:
        return list(messages)


class SeedShaped(_Base):
    """The seed-era ``from_config(config, context_length, **services)``."""

    @classmethod
    def from_config(cls, config: Config, context_length: int, *, store: Any = None, reach: Any = None) -> SeedShaped:  # type: ignore[override]
        return cls(context_length=context_length, config=config, store=store, reach=reach)


class SeedShapedTakingAll(_Base):
    @classmethod
    def from_config(cls, config: Config, context_length: int, **services: Any) -> SeedShapedTakingAll:  # type: ignore[override]
        return cls(context_length=context_length, **services)


class Plain(ContextEngine):
    """Hermes' plugin shape: a constructor taking the window, no ``from_config`` of its own."""

    def __init__(self, context_length: int = 200_000) -> None:
        super().__init__(context_length=context_length)

    name = "plain"  # type: ignore[assignment]

    def update_from_response(self, usage: Any) -> None:
        self._record_usage(usage)

    def should_compress(self, prompt_tokens: int | None = None) -> bool:
        return False

    def compress(self, messages: list[dict[str, Any]], current_tokens: int | None = None) -> list[dict[str, Any]]:
        return list(messages)


def _no_args() -> ContextEngine:
    return Plain(context_length=1234)


# -- the one adapter ----------------------------------------------------------------------------
def test_the_contract_shape_gets_settings_and_services() -> None:
    services = Services(context_length=9000, session_id="s1")
    engine = adapt(RulesEngine)(CompactionConfig(trigger_threshold=0.4), services)
    assert isinstance(engine, RulesEngine)
    assert engine.context_length == 9000 and engine.threshold_tokens == 3600


def test_the_seed_shape_gets_the_whole_config_the_window_and_the_services_it_names() -> None:
    cfg, store = Config(), SqliteStore(":memory:")
    services = Services(context_length=5000, store=store, config=cfg, reach="r", summarizer="s")
    engine = adapt(SeedShaped)(None, services)
    assert isinstance(engine, SeedShaped) and engine.context_length == 5000
    assert engine.seen == {"config": cfg, "store": store, "reach": "r"}  # named: reach too; no summarizer
    loose = adapt(SeedShapedTakingAll)(None, services)
    assert isinstance(loose, SeedShapedTakingAll)
    assert loose.seen == {"store": store, "summarizer": "s"}  # **services: never the newer reach


def test_plain_constructors_get_the_window_when_they_take_it() -> None:
    engine = adapt(Plain)(None, Services(context_length=4321))
    assert isinstance(engine, Plain) and engine.context_length == 4321
    assert adapt(_no_args)(None, Services(context_length=99)).context_length == 1234


def test_a_shape_is_read_once_per_registration() -> None:
    reg = Registration("seed", SeedShaped, "test")
    first = reg.build(Config(), Services(context_length=3000))
    builder = reg._build
    second = reg.build(Config(), Services(context_length=3000))
    assert builder is not None and reg._build is builder and first is not second


def test_registered_plugins_of_every_shape_are_built_by_the_registry() -> None:
    reg = EngineRegistry(entry_points=False)
    for name, factory in [("seed", SeedShaped), ("plain", Plain), ("noargs", _no_args)]:
        reg.register_engine_class(name, factory, "test")
    store = SqliteStore(":memory:")
    seed = reg.create("seed", context_length=7000, store=store)
    assert isinstance(seed, SeedShaped) and seed.context_length == 7000 and seed.seen["store"] is store
    assert reg.create("plain", context_length=6000).context_length == 6000
    assert reg.create("noargs").context_length == 1234
    with pytest.raises(TypeError, match="unknown service"):
        reg.create("plain", storre=store)


def test_focus_topic_is_offered_only_to_compress_that_takes_it() -> None:
    assert compress_takes_focus(RulesEngine) and compress_takes_focus(_Base)
    assert not compress_takes_focus(Plain)


def test_builtins_take_only_settings_and_services() -> None:
    with pytest.raises(TypeError, match="settings must be a CompressionConfig, not Config"):
        ContextCompressor.from_config(Config(), Services())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="services must be a Services, not int"):
        RulesEngine.from_config(None, 100_000)  # type: ignore[arg-type]
    engine = ContextCompressor.from_config(CompressionConfig(threshold=0.25), Services(context_length=40_000))
    assert engine.threshold_tokens == 10_000 and engine.name == "compressor"


# -- built-ins registered like plugins ------------------------------------------------------------
class MiniSettings(BaseModel):
    keep: int = 2


class Mini(_Base):
    Settings: ClassVar[type[MiniSettings]] = MiniSettings

    def __init__(self, context_length: int = 128_000, keep: int = 0) -> None:
        super().__init__(context_length=context_length)
        self.keep = keep


def test_a_new_builtin_is_one_registration_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BUILTINS, "mini", f"{__name__}:Mini")
    assert BUILTIN_ENGINES is BUILTINS
    reg = EngineRegistry(entry_points=False)
    assert "mini" in reg.names() and {"name": "mini", "source": "built-in"} in reg.describe()
    engine = reg.create("mini", context_length=8000)
    assert isinstance(engine, Mini) and (engine.keep, engine.context_length) == (2, 8000)


def test_every_builtin_reads_the_section_named_after_it() -> None:
    cfg = Config.from_dict({
        "compressor": {"threshold": 0.3},
        "rules": {"trigger_threshold": 0.4},
        "lcm": {"threshold": 0.6},
        "cacheaware": {"fold_ratio": 0.7},
    })
    reg, store = EngineRegistry(entry_points=False), SqliteStore(":memory:")
    got = {name: reg.create(name, cfg, context_length=10_000, store=store).threshold_tokens for name in BUILTINS}
    assert got == {"compressor": 3000, "rules": 4000, "lcm": 6000, "cacheaware": 7000}


def test_a_plugin_class_still_beats_a_builtin_but_not_another_plugin() -> None:
    reg = EngineRegistry(entry_points=False)
    reg.register_engine_class("rules", Plain, "first plugin")
    with pytest.warns(UserWarning, match="already registered by first plugin"):
        reg.register_engine_class("rules", SeedShaped, "second plugin")
    assert type(reg.create("rules")) is Plain


# -- section names: the engine's, the seeds' as aliases ----------------------------------------------
@pytest.mark.parametrize(("old", "new"), sorted(SECTION_ALIASES.items()))
def test_both_spellings_of_a_section_load_the_same(tmp_path: Path, old: str, new: str) -> None:
    key = "threshold: 0.35" if new == "compressor" else "trigger_threshold: 0.35"
    files = {}
    for name in (old, new):
        p = tmp_path / f"{name}.yaml"
        p.write_text(f"{name}:\n  {key}\n", encoding="utf-8")
        files[name] = load_config(p)
    assert getattr(files[old], new) == getattr(files[new], new) != getattr(Config(), new)
    assert getattr(files[new], old) is getattr(files[new], new)  # the old name still reads it


def test_both_spellings_given_must_agree(tmp_path: Path) -> None:
    same = tmp_path / "same.yaml"
    same.write_text("compression:\n  threshold: 0.4\ncompressor:\n  threshold: 0.4\n", encoding="utf-8")
    assert load_config(same).compressor.threshold == 0.4
    differ = tmp_path / "differ.yaml"
    differ.write_text("compaction:\n  trigger_threshold: 0.4\nrules:\n  trigger_threshold: 0.5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"differ\.yaml: 'compaction' is the older name of the 'rules' section and both are given"):
        load_config(differ)
    with pytest.raises(ConfigError, match="'compression' is the older name of the 'compressor' section"):
        Config().with_overrides(compression={"threshold": 0.3}, compressor={"threshold": 0.4})


def test_errors_name_the_section_as_written() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'compaction\.trigger'"):
        Config.from_dict({"compaction": {"trigger": 0.5}})
    with pytest.raises(ConfigError, match=r"unknown key 'rules\.trigger'"):
        Config.from_dict({"rules": {"trigger": 0.5}})
    with pytest.raises(ConfigError, match=r"unknown key 'compressor\.thresold'"):
        Config().with_overrides(compressor={"thresold": 0.5})


def test_with_overrides_takes_either_spelling() -> None:
    assert Config().with_overrides(compression={"threshold": 0.3}).compressor.threshold == 0.3
    assert Config().with_overrides(rules={"trigger_threshold": 0.3}).compaction.trigger_threshold == 0.3
    dumped = Config().with_overrides(compaction={"trigger_threshold": 0.3}).model_dump()
    assert "rules" in dumped and "compaction" not in dumped


def test_hermes_section_takes_either_spelling() -> None:
    for name in ("compression", "compressor"):
        s = settings_from_hermes_config({"ctxengine": {"engine": "rules", name: {"threshold": 0.6}}})
        assert s.config.compressor.threshold == 0.6
    with pytest.raises(ConfigError, match="unknown key"):
        settings_from_hermes_config({"ctxengine": {"compresion": {"threshold": 0.6}}})
