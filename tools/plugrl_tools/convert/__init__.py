"""Converting other frameworks' launch scripts into plugrl recipes (``plugrl convert``).

* :mod:`~plugrl_tools.convert.shell`: reading a bash script without running it;
* :mod:`~plugrl_tools.convert.overrides`: Hydra's ``key=value`` overrides;
* :mod:`~plugrl_tools.convert.verl`: a verl command's overrides mapped to plugrl's keys;
* :mod:`~plugrl_tools.convert.output`: the recipe as YAML, its validation, the report.
"""
