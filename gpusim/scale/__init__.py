"""Processes and scale: one process per device, and sizing a run to its device.

- `device`: `DeviceContext`, which rank this process is, its device and memory;
- `distributed`: the local launcher, joining the process group, collectives;
- `messenger`: `EventMessenger`, rank 0 does a thing once, the others wait;
- `search`: the auto-scale search (double, then bisect) and memory probes;
- `config`: `ScaleConfig`, the `scale` section of a run's config.

This layer sits on the runtime (backends, errors) and below training.
"""
