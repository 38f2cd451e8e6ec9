"""The rendezvous store, shared by the ranks (tfring.common) and the
launchers (tfring.runner, tfring.ray, tfring.spark): the authenticated wire
(:mod:`.wire`), the store's server and client (:mod:`.rendezvous`) and what
elastic drivers and workers keep in it (:mod:`.elastic_protocol`).

It sits below every other layer: it imports nothing else of tfring (and
never TensorFlow), so a rank can serve or reach the store without importing
the launcher. The public names are ``tfring.runner.wire``,
``tfring.runner.rendezvous`` and ``tfring.runner.start_rendezvous``.
"""
