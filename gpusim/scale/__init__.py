"""Processes and scale: one process per device, and sizing a run to its device.

- `device`: `DeviceContext`, which rank this process is, its device and memory;
- `distributed`: the local launcher, joining the process group, collectives;
- `messenger`: `EventMessenger`, rank 0 does a thing once, the others wait;
- `size_search`: auto-scaling's generic searches (the fastest size, the quickest to a
  score, the largest that fits) and memory probes; training.autoscale runs its trials;
- `scale_config`: `ScaleConfig`, the `scale` section of a run's config.

This layer sits on the runtime (backends, errors) and below training.
"""
