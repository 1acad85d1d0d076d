"""The kernel: the guarantees held once for every engine, stage by stage.

:class:`ctxengine.manager.ContextManager` is a short facade over these stages; none of them
imports it. Each stage takes what it needs (the config, the model's window, the store, the
session it works on) explicitly.

========================  ==========================================================
``state``                 a session's state, the model's window, ``CompactionDue``
``sessions``              the open sessions: created, reset, resumed, ended
``inputs``                the input stage: what is new, validated
``recording``             the store: opened, originals recorded, deferred writes, events
``counting``              the counters, the per-message counts engines read, anchors, usage
``engines``               the engine host: build, window, fallback, ``compress`` + output guard
``tools``                 tool dispatch: the tool list, its cost, engine and recall calls
``compaction``            hygiene, the engine's trigger, the no-thrash rest, the quick check
``cap``                   the window cap, after any engine
``breakpoints``           prompt-cache markers
``status``                counters, pressure warnings, ``status()``
``turn``                  one turn: the stages in their order
========================  ==========================================================
"""
