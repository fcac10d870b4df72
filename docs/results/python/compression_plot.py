import kvzap
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

pipe = kvzap.pipeline("SmolLM2-135M-Instruct", n_ctx=2048)
runs = {"no press": None}
for r in (0.25, 0.5, 0.75):
    runs[f"SnapKV {r}"] = kvzap.SnapKVPress(compression_ratio=r)
for t in (-6.0, -4.0):
    runs[f"KVzap-MLP {t}"] = kvzap.KVzapPress(model_type="mlp", threshold=t)

rows = []
for name, press in runs.items():
    df = kvzap.eval.ruler(pipe, press, length=1024, samples=3, tasks=["niah_single_1", "niah_single_2"], seed=42)
    rows.append({"press": name, "score": df["score"].mean(), "evicted": df["evicted_fraction"].mean(), "n": len(df)})
table = pd.DataFrame(rows)
print(table.to_string(index=False))

fig, ax = plt.subplots(figsize=(5, 3.5))
for kind, marker in (("SnapKV", "s"), ("KVzap", "o"), ("no press", "*")):
    part = table[table["press"].str.startswith(kind)]
    ax.plot(part["evicted"], part["score"], marker=marker, label=kind)
ax.set_xlabel("evicted fraction")
ax.set_ylabel("RULER-style score")
ax.legend()
fig.savefig("compression.png", dpi=120, bbox_inches="tight")
