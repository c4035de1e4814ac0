"""The interfaces of the kinds of part a run is composed of.

Each module holds one kind: its abstract class (what a plugin implements) and the attrs config
class of its recipe section (what a plugin's own config class extends).

* :mod:`plugrl.parts.device`: ``Device``, ``DeviceConfig``
* :mod:`plugrl.parts.backend`: ``TrainingBackend``, ``ActorConfig``, ``CriticConfig``
* :mod:`plugrl.parts.rollout`: ``RolloutEngine``, ``RolloutConfig``, ``SamplingParams``,
  ``Capability`` and the methods each needs (``CAPABILITY_METHODS``)
* :mod:`plugrl.parts.transport`: ``WeightTransport``
* :mod:`plugrl.parts.algorithm`: ``AdvantageEstimator``, ``PolicyLoss``, ``KLPenalty``,
  ``ActorObjective``, ``LossScale``, ``AlgorithmConfig``, ``PolicyLossConfig``
* :mod:`plugrl.parts.reward`: ``RewardManager``, ``RewardConfig``, ``RewardOutput``,
  ``ScoringFunction``
* :mod:`plugrl.parts.scoring`: the scoring function of each data source, its options, and one
  call of it on one sample (``Scorer``)
* :mod:`plugrl.parts.scheduler`: ``Scheduler``, ``SchedulerConfig``
* :mod:`plugrl.parts.logger`: ``MetricLogger``
* :mod:`plugrl.parts.context`: ``PartContext``, what every part but a scheduler is built with

None of these modules imports torch at import time.
"""
