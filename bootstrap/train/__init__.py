"""``fab train``, ``fab jobs``, ``fab logs``, ``fab cancel``, by concern.

- :mod:`~bootstrap.tasks.train`: the four tasks and their glue;
- :mod:`~bootstrap.train.workdir`: which workdir files go to the nodes (git or the
  .gitignore files), their manifest, the diff against the node's and the tar sent;
- :mod:`~bootstrap.train.spec`: the request checked, the job spec every node gets, and the
  judgement of a node's facts (can it run the job?);
- :mod:`~bootstrap.train.steps`: the node-side steps (train-check, train-start, jobs, logs,
  cancel, resume-check) and the runner files they ship;
- :mod:`~bootstrap.train.jobs`: the nodes' job records merged into one row per job, and
  their table;
- :mod:`~bootstrap.train.runs`: running those steps across the fleet and reading back what
  they found;
- :mod:`~bootstrap.train.chart`: a job's chart (GPU utilisation and memory per node, its
  events) from what its nodes recorded;
- :mod:`~bootstrap.train.resume`: which recorded job ``--resume`` reruns, and whether it has
  a checkpoint to resume from.
"""
