"""Converting other frameworks' launch scripts into plugrl recipes (``plugrl convert``).

* :mod:`~plugrl.convert.shell`: reading a bash script without running it;
* :mod:`~plugrl.convert.overrides`: Hydra's ``key=value`` overrides;
* :mod:`~plugrl.convert.verl`: a verl command's overrides mapped to plugrl's keys;
* :mod:`~plugrl.convert.output`: the recipe as YAML, its validation, the report.
"""
