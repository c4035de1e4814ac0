"""The interfaces of the kinds of part a run is composed of.

Each module holds one kind: its abstract class (what a plugin implements) and the attrs config
class of its recipe section (what a plugin's own config class extends).

* :mod:`plugrl.parts.device`: ``Device``, ``DeviceConfig``
* :mod:`plugrl.parts.backend`: ``TrainingBackend``, ``ActorConfig``, ``CriticConfig``
* :mod:`plugrl.parts.rollout`: ``RolloutEngine``, ``RolloutConfig``, ``SamplingParams``
* :mod:`plugrl.parts.algorithm`: ``AdvantageEstimator``, ``PolicyLoss``, ``ActorObjective``
* :mod:`plugrl.parts.reward`: ``RewardManager``, ``RewardConfig``, ``RewardOutput``
* :mod:`plugrl.parts.scheduler`: ``Scheduler``, ``SchedulerConfig``
* :mod:`plugrl.parts.logger`: ``MetricLogger``

None of these modules imports torch at import time.
"""
