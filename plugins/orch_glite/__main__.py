"""``python -m orch_glite serve ...``: the emulated WMS without the orchestrator's CLI (``orchestrator wms``)."""

from .cli import wms_group

if __name__ == "__main__":
    wms_group(prog_name="python -m orch_glite")
