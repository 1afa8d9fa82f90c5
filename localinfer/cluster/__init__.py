"""Serving across machines: `localinfer serve --ray` (needs the [cluster] extra, ray[serve]).

An ingress deployment runs the single-process server's app with remote engines (ingress.py,
ingress_pool.py, remote_loop.py, replica_header.py); engine replicas each hold one engine
(replica.py); a request router picks the replica by prompt prefix (routing.py: the pure
policy; ray_router.py: its Serve plug-in); launch.py builds and runs the application.
Only launch/CLI code imports this package, so Ray stays out of every other import path.
"""
