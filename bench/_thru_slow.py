import asyncio, sys, os
sys.path.insert(0, os.path.dirname(__file__))
from e2e import job_stream
from live import start_stack, submit_paced, wait_placed, log_position
from corral.client import Client
from corral.contracts.queues import validate_queues
from corral.contracts.registry import decode

async def main(live):
    client = await Client.connect(live.context)
    await client.apply_queues(validate_queues({"queues": [{"name": "bench", "guaranteed_gpus": 0}]}))
    await client.wait_for(lambda v: "bench" in v.queues, 30)
    jobs = job_stream(int(sys.argv[1]) * int(sys.argv[2]), 1.0, 1, "sim-timer", live.data_dir)
    after = await log_position(client)
    await submit_paced(client, jobs, float(sys.argv[1]))
    await wait_placed(client, [j for j, _ in jobs], after, 60)
    await asyncio.sleep(15)
    rows = []
    pos = after
    while True:
        b = await client.store.read_all(pos, limit=10000)
        if not b: break
        pos = b[-1].position
        rows += b
    by = {}
    for r in rows:
        by.setdefault(r.stream, []).append(r)
    slow = []
    for s, evs in by.items():
        if not s.startswith("job-"): continue
        t = {e.type: e.recorded_at for e in evs}
        if "GangReserved" in t and "JobRunning" in t:
            slow.append(((t["JobRunning"] - t["GangReserved"]).total_seconds(), s))
    slow.sort()
    print("placed->running s: p50", slow[len(slow)//2][0], "max", slow[-1][0], "n", len(slow))
    for d, s in slow[-3:]:
        print("==", s, d)
        t0 = by[s][0].recorded_at
        for e in by[s]:
            ev = decode(e.data)
            print(f"  {(e.recorded_at - t0).total_seconds():7.3f} occ {(ev.occurred_at - t0).total_seconds():7.3f} {e.type:16s} {getattr(ev,'actor','')} {str(getattr(ev,'reason',''))[:120]} {getattr(ev,'node','')}")
    # node events
    for s, evs in []:
        if s.startswith("node-"):
            for e in evs:
                if e.type not in ("GpusAllocated", "GpusReleased"):
                    print(" node", s, e.type, e.recorded_at)
    await client.close()

live = start_stack(sys.argv[3])
try:
    asyncio.run(main(live))
finally:
    live.stop()
