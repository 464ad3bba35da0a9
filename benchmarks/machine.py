"""Facts about the machine a benchmark ran on, shared by the drivers."""
import platform


def cpu_model():
    """The processor's model name from /proc/cpuinfo (or what platform says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
