"""Facts about the machine a benchmark ran on, shared by the drivers."""
import os
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


def load_average():
    """The 1, 5 and 15 minute load averages, rounded; None where unavailable."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
