import sys, tempfile, json
from pathlib import Path
from continuum.backends.models import resolve_model
from continuum.bench import tiers
mf = resolve_model(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    sp = tiers.shared_prefix(mf, 1, 2, Path(d) / "sp", True)
    wf = tiers.workflow(mf, 1, 2, Path(d) / "wf", True)
print(json.dumps({"model": mf.path.name, "exact": True, "sp_identical": [sp["answers_identical"], sp["answers_compared"]], "sp_mismatches": sp["mismatches"],
  "wf_identical": [wf["answers_identical"], wf["answers_compared"]], "wf_mismatches": wf["mismatches"], "sp_tokens": sp["tokens_sent_per_later_call_with"], "wf_tokens": wf["tokens_sent_with"]}))
