"""Hosting the parts of a run: backend ranks and rollout engines, in this process or as Ray
actors, and the weight transports between them.

* :mod:`plugrl.cluster.base`: :class:`~plugrl.cluster.base.WorkerGroup`, the ranks of one
  role driven like one backend (batches split by data-parallel rank, outputs gathered,
  metrics averaged);
* :mod:`plugrl.cluster.local`: one rank in the driver process (``cluster: local``);
* :mod:`plugrl.cluster.ray_group`: N Ray actors placed by the device's Ray resource
  (``cluster: ray``), the placement the roles share, and starting Ray (``init_ray``);
* :mod:`plugrl.cluster.groups`: the group and placement a recipe asks for
  (``make_worker_group``, ``make_placement``);
* :mod:`plugrl.cluster.worker`: what a worker process does to host a backend rank;
* :mod:`plugrl.cluster.engines`: the group of rollout engines;
* :mod:`plugrl.cluster.transports`: how weights reach the engines.

Nothing here is imported by importing this package: torch and Ray are imported by the modules
that need them, when a run uses them.
"""
