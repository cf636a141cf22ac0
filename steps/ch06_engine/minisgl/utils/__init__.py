"""Small helpers shared by the upper modules."""

from .device import (Event, NullEvent, NullStream, Stream, configure_threads, create_event,
                     create_stream, current_stream, physical_core_count, pick_device, pin,
                     synchronize, usable_cpu_count, use_stream)
from .registry import Registry
