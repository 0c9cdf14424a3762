"""A KV-event subscriber for perf/http/kv_events_cost.sh: connects a SUB to
the endpoint (ZeroMQ reconnects it across the server's restarts) and
drains it, or, with --slow, never reads (its queue in the server fills).
Runs until killed."""

import argparse
import signal

import zmq

p = argparse.ArgumentParser()
p.add_argument("--endpoint", required=True)
p.add_argument("--slow", action="store_true")
a = p.parse_args()
sub = zmq.Context.instance().socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.setsockopt(zmq.RCVHWM, 1 if a.slow else 0)
sub.connect(a.endpoint)
if a.slow:
    signal.pause()
while True:
    sub.recv_multipart()
