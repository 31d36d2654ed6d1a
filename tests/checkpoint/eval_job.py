"""A real evaluation script: load a tiny-train checkpoint with DCP and report its loss on held-out data.

Used by the checkpoint-watch tests. Every start appends a line to $EVAL_LOG (so a test can count runs per
step). $EVAL_GATE, when set, is a directory: the script waits until a file named after its step appears
there (the test's way of holding an evaluation open while it kills the watcher). $EVAL_FAIL_ONCE, when set,
names a step whose first run dies, to exercise retries.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from vigil_eval.tinytrain import make_dataset, make_model

checkpoint = Path(os.environ["VIGIL_CHECKPOINT_PATH"])
step = int(os.environ["VIGIL_CHECKPOINT_STEP"])
log = Path(os.environ["EVAL_LOG"])
with log.open("a") as out:
    out.write(f"{step}\n")
first_run = sum(1 for line in log.read_text().splitlines() if line == str(step)) == 1
if os.environ.get("EVAL_FAIL_ONCE") == str(step) and first_run:
    os.kill(os.getpid(), signal.SIGKILL)
gate = os.environ.get("EVAL_GATE")
if gate:
    while not (Path(gate) / str(step)).exists():
        time.sleep(0.05)

model = make_model(seed=0)
state = {"model": model.state_dict()}
dcp.load(state, checkpoint_id=str(checkpoint))
model.load_state_dict(state["model"])
model.eval()
inputs, targets = make_dataset(seed=0)  # the job's own data: the loss must fall as it trains
with torch.no_grad():
    loss = torch.nn.functional.mse_loss(model(inputs), targets).item()
print("evaluated", checkpoint)
print(json.dumps({"loss": loss, "step_seen": step}))
