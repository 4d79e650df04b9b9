# Modal app: generate function, tier balanced.
# Rendered by `deno task deploy render` from deploy/configs/balanced.json (cpu variant).
# Do not edit: change the config and render again (a test fails when this file is stale).
# Deploy from the repository root: modal deploy deploy/modal/kvrelay_balanced.py
# Secrets: Modal secret "kvrelay" holding KVRELAY_API_KEYS, KVRELAY_REDIS_URL, KVRELAY_SNAPSHOT_KEY, KVRELAY_TENANT_SALT.
import os
import subprocess
from pathlib import Path

import modal

ROOT = Path(__file__).resolve().parents[2]
# Modal needs Python in the image; the image's ENTRYPOINT is replaced by the web server below.
image = modal.Image.from_dockerfile(
    str(ROOT / "deploy/Dockerfile"), context_dir=str(ROOT), add_python="3.12"
).entrypoint([])
app = modal.App("kvrelay-balanced")


@app.function(
    image=image,
    secrets=[modal.Secret.from_name("kvrelay")],
    cpu=2,
    memory=2048,
    gpu=None,
    min_containers=0,
    max_containers=10,
    scaledown_window=300,
    timeout=60,
)
@modal.concurrent(max_inputs=80, target_inputs=64)
@modal.web_server(8080, startup_timeout=240)
def kvrelay_balanced() -> None:
    subprocess.Popen(
        ["deno", "run", "--cached-only", "-A", "functions/generate/main.ts"],
        cwd="/app",
        env={**os.environ, **{"KVRELAY_CONFIG": "/app/deploy/configs/balanced.json", "PORT": "8080", "HOST": "0.0.0.0"}},
    )
