"""ctxengine inside Hermes Agent: a context-engine plugin for Hermes' plugin manager.

``pip install 'ctxengine[hermes]'`` into Hermes' environment, ``hermes plugins enable
ctxengine``, then ``context.engine: ctxengine`` in Hermes' config.yaml. The pieces:

* :mod:`.adapter`: Hermes' engine contract over a ctxengine engine (no Hermes import);
* :mod:`.engine`: the same on Hermes' ABC (imported inside Hermes only);
* :mod:`.plugin`: the entry point's ``register(ctx)``;
* :mod:`.install`: writes the ``plugins/context_engine/ctxengine/`` directory variant.
"""
