"""`localinfer bench soak`: minutes of mixed, abusive load on a server, and what it left behind.

workload.py draws each request (kind, endpoint, lengths, where to disconnect, which hostile
body); client.py sends one and classifies its outcome; sampler.py reads /metrics and the
server's RSS every second; analysis.py turns outcomes and samples into figures and a verdict;
report.py prints them; server_proc.py starts `localinfer serve` when no --url is given; run.py
runs the phases (soak, or the --overload bursts against an unloaded baseline).
"""
