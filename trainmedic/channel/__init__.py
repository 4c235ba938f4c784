"""The agent -> controller channel: node agents push findings and heartbeats over HTTP.

- `wire`: the signed request format both ends share, and the small HTTP/1.1 framing.
- `receiver`: the controller's side (validate, rate-limit, deliver, last-seen table).
- `liveness`: the controller's node-death detector over the last-seen table.
- `client`: the agent's side (push, spool fallback, drain, heartbeat, probe listener).
"""
