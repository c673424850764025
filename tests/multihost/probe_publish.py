"""Publish as this container's identity on the subjects given; print the server's refusals as JSON.

Run inside a task container (docker exec ... python - SUBJECT... < this file),
so it speaks as the credentials that node's engine mounted, over the overlay
network. Prints {"identity": ..., "refused": [...]}: the server's
permissions-violation errors, one per refused subject; or {"identity": ...,
"error": ...} when the server does not let the identity connect at all.
"""

import asyncio
import json
import os
import sys

from shared import auth
from shared.bus import Bus, BusError


async def main(subjects: list[str]) -> None:
    creds = os.environ["DQOES_NATS_CREDS"]
    try:
        bus = await Bus.connect(auth.resolve("nats://nats:4222", creds), "probe", connect_timeout_s=4.0)
    except BusError as e:
        print(json.dumps({"identity": auth.load(creds).identity, "error": str(e)}))
        return
    for subject in subjects:
        await bus.publish_raw(subject, b"{}")
    await bus.flush()
    await asyncio.sleep(1.5)  # the server's -ERR for a refused publish comes asynchronously
    print(json.dumps({"identity": auth.load(creds).identity, "refused": list(bus.permission_violations)}))
    await bus.close()


asyncio.run(main(sys.argv[1:]))
