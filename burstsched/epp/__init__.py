"""``burstsched epp``: the router as the endpoint picker (EPP) of a Gateway API inference gateway.

The gateway (Envoy and the gateways built on it) proxies every request itself and asks the picker where it
goes over Envoy's external processing protocol (``ext_proc``, a bidirectional gRPC stream per HTTP request),
as the Gateway API Inference Extension's endpoint picker protocol specifies. The picker holds the same
config, plugins, admission window, prefix index and endpoint pool as ``burstsched serve``; only the front
differs. Modules, one concept each:

- :mod:`~burstsched.epp.wire`: reading Envoy's messages and building the picker's answers (destination
  header and ``envoy.lb`` metadata, streamed body echo, immediate responses in OpenAI's error shape);
- :mod:`~burstsched.epp.picker`: one request's decision (parse, admission, scheduling, subset hint);
- :mod:`~burstsched.epp.accounting`: the pool's bookkeeping for a request the gateway proxies;
- :mod:`~burstsched.epp.session`: one ext_proc stream, in the message order of each body mode;
- :mod:`~burstsched.epp.service`: the gRPC server (ext_proc and health) around the router's assembly;
- :mod:`~burstsched.epp.cli`: the ``burstsched epp`` subcommand.
"""
