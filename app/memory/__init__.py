"""Memory: how much RAM this machine gives Ferry and how a model uses it.

- ``budget``: the machine's usable memory and the automatic budget formula;
- ``plan``: a container's RAM plan and THE budget rule (``recommend``), used
  to open a model and marked on the window's RAM gauge;
- ``disk_probe``: how fast a folder's disk reads expert-sized records;
- ``stats``: the live figures and the RAM split the gauges show (no Qt).

The byte formatter is the floor ``app.units``; the plan of a bare config.json
(``ferry plan --config``) is ``app.convert.plan_config``, a floor above.
"""
