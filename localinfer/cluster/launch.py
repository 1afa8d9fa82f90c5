"""`localinfer serve --ray`: the Serve application (ingress + engine replicas) and its run.

Sizing policy:
- each engine replica reserves `threads_per_replica` CPUs from Ray (num_cpus) and runs its
  kernels on that many threads; Serve sends it at most max_num_seqs requests at once (one
  engine batch: max_ongoing_requests), the rest wait in the ingress's router;
- fixed `replicas`, or autoscaling between `min_replicas` and `max_replicas` on queue length:
  Serve adds a replica when the requests per replica (running + waiting in the router) stay
  above a full batch, and removes one when they stay below;
- the ingress takes no CPU reservation (it tokenizes and forwards); it runs on the head node
  and serves HTTP on the server's --host/--port itself (ingress.py says why not Serve's proxy).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from localinfer.server.config import ServerConfig

log = logging.getLogger("localinfer.cluster")
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray's marker resource of the head node
# By default Serve runs a replica's methods on an event loop thread of their own, and a
# handle's router on another: each request and each output would cross threads once more on
# either side. Neither deployment blocks its loop (the engine has its own thread; the ingress
# serves HTTP on its own thread, whose loop then also runs the handle's router). Measured on
# one-token requests: ~+4.2 -> ~+3.4 ms a request over plain `serve`.
SERVE_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
             "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    replicas: int | None = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    threads_per_replica: int = 1
    address: str | None = None  # None: start a one-machine Ray; "auto": join the running one
    router: str = "prefix"  # or "round-robin" (ray_router.ROUTERS)
    imbalance_threshold: int | None = None  # routing.DEFAULT_THRESHOLD when None


def scaling(config: ServerConfig, options: ClusterOptions) -> dict[str, Any]:
    """The engine deployment's replica count or autoscaling config."""
    if options.min_replicas is None and options.max_replicas is None:
        return {"num_replicas": options.replicas or 1}
    low = options.min_replicas if options.min_replicas is not None else 1
    high = options.max_replicas if options.max_replicas is not None else max(low, 1)
    return {"autoscaling_config": {
        "min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
        "target_ongoing_requests": config.max_num_seqs,
        "upscale_delay_s": 5.0, "downscale_delay_s": 60.0}}


def build_application(config: ServerConfig, model: str, options: ClusterOptions) -> Any:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from localinfer.cluster.ingress import ENGINE_DEPLOYMENT, Ingress
    from localinfer.cluster.ray_router import ROUTERS
    from localinfer.cluster.replica import EngineReplica

    kwargs = ({"threshold": options.imbalance_threshold}
              if options.imbalance_threshold is not None and options.router == "prefix" else {})
    engine = serve.deployment(
        EngineReplica, name=ENGINE_DEPLOYMENT,
        ray_actor_options={"num_cpus": options.threads_per_replica,
                           "runtime_env": {"env_vars": SERVE_ENV}},
        max_ongoing_requests=config.max_num_seqs, logging_config=_logging(config),
        request_router_config=RequestRouterConfig(request_router_class=ROUTERS[options.router],
                                                  request_router_kwargs=kwargs),
        **scaling(config, options))
    replica_config = dataclasses.replace(config, threads=options.threads_per_replica)
    # on the head node, where --host/--port are; no CPU reserved (it tokenizes and forwards)
    ingress = serve.deployment(Ingress, name="ingress", num_replicas=1,
                               ray_actor_options={"num_cpus": 0,
                                                  "resources": {HEAD_NODE_RESOURCE: 0.001},
                                                  "runtime_env": {"env_vars": SERVE_ENV}},
                               graceful_shutdown_timeout_s=config.drain_timeout + 10,
                               logging_config=_logging(config))
    return ingress.bind(config, engine.bind(replica_config, model))


def start(config: ServerConfig, model: str, options: ClusterOptions) -> None:
    """Join or start Ray (unless this process has already), run the application; the
    ingress serves HTTP on config.host:port."""
    import sys

    if options.address is None and "ray" not in sys.modules:
        require_token()  # Ray reads it when first imported
    import ray
    from ray import serve

    from localinfer.cluster.ingress import APP_NAME

    if not ray.is_initialized():
        ray.init(address=options.address, include_dashboard=False,
                 logging_level=logging.WARNING)
    serve.start(proxy_location="Disabled")  # the ingress serves HTTP itself (ingress.py)
    serve.run(build_application(config, model, options), name=APP_NAME, route_prefix=None,
              blocking=False)


def require_token() -> None:
    """A Ray started here listens on every interface (Ray has no loopback-only mode), and
    whoever reaches its ports can run code in it: turn on Ray's token authentication with a
    fresh random token, unless the environment already chose (RAY_AUTH_MODE). Processes of
    this Ray inherit it; nothing outside them knows it."""
    import os
    import secrets

    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def run(config: ServerConfig, model: str, options: ClusterOptions) -> None:
    """`serve --ray` in the foreground: until SIGINT/SIGTERM, then Serve shuts down (streams
    in flight end) and a Ray started here stops."""
    import ray
    from ray import serve

    def stop(sig: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    start(config, model, options)
    signal.signal(signal.SIGTERM, stop)  # after ray.init, which installs a handler of its own
    log.info("serving on http://%s:%d (Ray Serve)", config.host, config.port)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        log.info("shutting down")
    finally:
        serve.shutdown()
        ray.shutdown()


def _logging(config: ServerConfig) -> dict[str, Any]:
    """Serve's per-call access log line costs every request a write (and a trip to the
    driver's console); it follows --log-level debug only."""
    return {"log_level": config.log_level.upper(),
            "enable_access_log": config.log_level == "debug"}
