#!/usr/bin/env python3
"""Opens N keep-alive connections to a proxy, sends one GET on each and reads its answer,
then holds them all idle until stdin closes. Used by hack/bench/proxy.sh (scenarios idle and
idle-tls) to measure a proxy's memory per idle client connection.

Usage: hold.py PORT COUNT [tls]. Prints "held COUNT" once every connection has its answer;
exits non-zero when a connection fails or an answer is not 200.
"""

import asyncio
import ssl
import sys

# Requests in flight at once while opening: as many as the load scenarios' connections, so
# each proxy's backend pool grows to about the same size as in them.
AT_ONCE = 50


async def one(port, tls, held):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    writer.write(b"GET / HTTP/1.1\r\nHost: bench.example\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        raise RuntimeError(f"answer {status}")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    held.append(writer)


async def main():
    port, count = int(sys.argv[1]), int(sys.argv[2])
    tls = None
    if len(sys.argv) > 3 and sys.argv[3] == "tls":
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        tls.minimum_version = ssl.TLSVersion.TLSv1_3
    held = []
    for start in range(0, count, AT_ONCE):
        batch = range(start, min(start + AT_ONCE, count))
        await asyncio.gather(*(one(port, tls, held) for _ in batch))
    print(f"held {len(held)}", flush=True)
    # Hold until the caller has read the proxy's memory and closes stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for writer in held:
        writer.close()


if __name__ == "__main__":
    asyncio.run(main())
