"""Data: the ``Batch`` container (:mod:`plugrl.data.batch`), parquet datasets in verl's schema
and their prompt batches (:mod:`plugrl.data.dataset`), and a rollout's completions in verl's
batch layout (:mod:`plugrl.data.rollout_batch`)."""
