import sys, tempfile, time, json, statistics
from pathlib import Path
from continuum.backends.models import resolve_model
from continuum.bench import tiers
mf = resolve_model(sys.argv[1])
reps = int(sys.argv[2])
out = {"model": mf.path.name, "runs": []}
with tempfile.TemporaryDirectory() as d:
    for rep in range(reps):
        for exact in ((False, True) if rep % 2 == 0 else (True, False)):
            sp = tiers.shared_prefix(mf, 1, 2, Path(d) / f"{rep}{exact}", exact)
            wf = tiers.workflow(mf, 1, 2, Path(d) / f"w{rep}{exact}", exact)
            row = {"exact": exact, "rep": rep,
                   "sp_identical": [sp["answers_identical"], sp["answers_compared"]], "sp_mismatches": sp["mismatches"],
                   "sp_tokens_per_later_call": sp["tokens_sent_per_later_call_with"],
                   "sp_ttft_hit": sp["median_ttft_ms_hit"], "sp_ttft_without": sp["median_ttft_ms_without"],
                   "wf_identical": [wf["answers_identical"], wf["answers_compared"]], "wf_mismatches": wf["mismatches"],
                   "wf_tokens": wf["tokens_sent_with"], "wf_tokens_without": wf["tokens_sent_without"],
                   "wf_seconds": wf["median_seconds_with"], "wf_seconds_without": wf["median_seconds_without"]}
            out["runs"].append(row)
            print(json.dumps(row), flush=True)
print(json.dumps(out))
