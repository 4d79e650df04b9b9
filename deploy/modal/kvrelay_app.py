# Modal app: one web endpoint per tier, each running one kvrelay function from the CPU image
# (deploy/Dockerfile). Deploy from the repository root: `modal deploy deploy/modal/kvrelay_app.py`.
# Secrets: a Modal secret "kvrelay" holding KVRELAY_API_KEYS, KVRELAY_SNAPSHOT_KEY,
# KVRELAY_TENANT_SALT and KVRELAY_REDIS_URL. CPU only: this build has no CUDA backend (see
# deploy/CUDA.md), so no gpu= argument is set.
import os
import subprocess

import modal

image = modal.Image.from_dockerfile("deploy/Dockerfile", context_dir=".")
app = modal.App("kvrelay")
secrets = [modal.Secret.from_name("kvrelay")]

TIERS = {
    # tier: (function, config, cpu cores, memory MiB)
    "fast": ("prefill", "deploy/configs/fast.json", 2.0, 2048),
    "balanced": ("generate", "deploy/configs/balanced.json", 2.0, 2048),
    "powerful": ("decode", "deploy/configs/powerful.json", 4.0, 4096),
}


def _serve(function: str, config: str) -> None:
    env = {"FUNCTION": function, "KVRELAY_CONFIG": f"/app/{config}", "PORT": "8080", "HOST": "0.0.0.0"}
    subprocess.Popen(
        ["sh", "-c", f"cd /app && exec npx -y deno@2.9.6 run -A functions/{function}/main.ts"],
        env={**os.environ, **env},
    )


def _make(tier: str):
    function, config, cpu, memory = TIERS[tier]

    @app.function(image=image, secrets=secrets, cpu=cpu, memory=memory, min_containers=1,
                  name=f"kvrelay_{tier}", serialized=True)
    @modal.concurrent(max_inputs=8)
    @modal.web_server(8080, startup_timeout=120)
    def serve() -> None:
        _serve(function, config)

    return serve


fast = _make("fast")
balanced = _make("balanced")
powerful = _make("powerful")
