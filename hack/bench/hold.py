#!/usr/bin/env python3
"""Opens N keep-alive connections to a proxy, sends one GET on each and reads its answer,
then holds them all idle until stdin closes. Used by hack/bench/proxy.sh (scenarios idle,
idle-tls and idle-h2) to measure a proxy's memory per idle client connection.

Usage: hold.py PORT COUNT [tls|h2]. `h2` speaks HTTP/2 over TLS (ALPN h2): one stream, its
answer read to END_STREAM, the connection then held open as a browser holds one. Prints
"held COUNT" once every connection has its answer; exits non-zero when a connection fails
or an answer is not 200.
"""

import asyncio
import ssl
import sys

# Requests in flight at once while opening: as many as the load scenarios' connections, so
# each proxy's backend pool grows to about the same size as in them.
AT_ONCE = 50


# HTTP/2 frame types used here (RFC 9113 section 6).
DATA, HEADERS, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


# GET https://bench.example/ in HPACK (RFC 7541): :method GET, :scheme https and :path / from
# the static table (indexes 2, 7, 4), then :authority as a literal without indexing whose
# name is static index 1, its value not Huffman-coded.
GET_BLOCK = bytes([0x82, 0x87, 0x84, 0x01, len(b"bench.example")]) + b"bench.example"


async def one_h2(port, tls, held):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    if writer.get_extra_info("ssl_object").selected_alpn_protocol() != "h2":
        raise RuntimeError("the proxy did not choose h2")
    writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(SETTINGS, 0, 0))
    writer.write(frame(HEADERS, END_STREAM | END_HEADERS, 1, GET_BLOCK))
    await writer.drain()
    while True:
        header = await reader.readexactly(9)
        length = int.from_bytes(header[:3], "big")
        kind, flags = header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
        payload = await reader.readexactly(length)
        if kind == SETTINGS and not flags & ACK:
            writer.write(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            writer.write(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            raise RuntimeError("GOAWAY from the proxy")
        elif kind == HEADERS and stream == 1:
            # Every encoder here sends :status 200 as static index 8, after a dynamic table
            # size update (first octet 001xxxxx, RFC 7541 section 6.3) when it announces
            # one; coxswain announces 0 in its first block. Padding and priority are not
            # used on answers to this request, and the sizes here fit the 5-bit prefix.
            block = payload
            while block[:1] and block[0] & 0xE0 == 0x20:
                block = block[1:]
            if block[:1] != b"\x88":
                raise RuntimeError(f"answer header block starts {payload[:4].hex()}, not :status 200")
        if kind in (HEADERS, DATA) and stream == 1 and flags & END_STREAM:
            break
    await writer.drain()
    held.append(writer)


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
    mode = sys.argv[3] if len(sys.argv) > 3 else "clear"
    tls = None
    if mode in ("tls", "h2"):
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        tls.minimum_version = ssl.TLSVersion.TLSv1_3
        tls.set_alpn_protocols(["h2"] if mode == "h2" else ["http/1.1"])
    connect = one_h2 if mode == "h2" else one
    held = []
    for start in range(0, count, AT_ONCE):
        batch = range(start, min(start + AT_ONCE, count))
        await asyncio.gather(*(connect(port, tls, held) for _ in batch))
    print(f"held {len(held)}", flush=True)
    # Hold until the caller has read the proxy's memory and closes stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for writer in held:
        writer.close()


if __name__ == "__main__":
    asyncio.run(main())
