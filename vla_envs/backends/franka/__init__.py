"""The real Franka behind the env contract: ``twin.py`` (the twin's observation and action as
data and pure functions), ``backend.py`` (``FrankaBackend``), ``operator.py`` (resets and labels),
``make.py`` (``franka/PutOnPlate-v0``). Robot SDKs come from ``real_robot`` and load lazily."""
