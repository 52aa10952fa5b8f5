"""A TCP proxy on 127.0.0.1 that injects latency and network failures.

Fault tests put it between a node and the database to make the network slow
(the clock-offset estimate must widen its error bound), or to cut a node off
(it must stop its jobs before its lease runs out, and a peer must take over).

Every chunk read is stamped and written out `delay` seconds later, so latency is
added without throttling throughput, and byte order is kept. One asyncio loop in
a single background thread serves all connections; `stop()` joins it.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["TcpProxy"]

_CHUNK = 65536
_HOST = "127.0.0.1"


class TcpProxy:
    """Forward 127.0.0.1:`port` to `target_host`:`target_port`.

    `up_delay` (client to server) and `down_delay` (server to client) are
    seconds and may be changed while connections are open; a new value applies
    to bytes read from then on.
    """

    def __init__(self, target_host: str, target_port: int, up_delay: float = 0.0, down_delay: float = 0.0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.up_delay = up_delay
        self.down_delay = down_delay
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None  # cleared while frozen
        self._links: set[asyncio.Task] = set()
        self._cut = False

    def start(self) -> int:
        """Start listening on a free port; return it (also kept in `.port`)."""
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"TcpProxy->{self.target_port}", daemon=True
        )
        self._thread.start()
        self.port = self._call(self._listen())
        return self.port

    def stop(self) -> None:
        """Close the listener and every connection, and join the loop's thread."""
        if self._thread is None:
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._thread = self._loop = None

    def cut(self) -> None:
        """Drop every open connection and close new ones at once, until `restore()`."""
        self._call(self._set(cut=True, frozen=False))

    def freeze(self) -> None:
        """Black-hole the link: connections stay open but no byte moves until `restore()`.

        Held bytes are delivered on `restore()`, as TCP retransmits after a
        partition heals.
        """
        self._call(self._set(cut=False, frozen=True))

    def restore(self) -> None:
        """Undo `cut()` or `freeze()`."""
        self._call(self._set(cut=False, frozen=False))

    def _call(self, coro):
        """Run `coro` on the proxy's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _listen(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, _HOST, 0)
        return self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        self._server.close()
        await self._drop_links()
        await self._server.wait_closed()

    async def _set(self, cut: bool, frozen: bool) -> None:
        self._cut = cut
        if frozen:
            self._flowing.clear()
        else:
            self._flowing.set()
        if cut:
            await self._drop_links()

    async def _drop_links(self) -> None:
        links = list(self._links)
        for link in links:
            link.cancel()
        await asyncio.gather(*links, return_exceptions=True)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._cut:
            client_w.transport.abort()
            return
        link = asyncio.current_task()
        self._links.add(link)
        writers = [client_w]
        clean = False
        try:
            server_r, server_w = await asyncio.open_connection(self.target_host, self.target_port)
            writers.append(server_w)
            up, down = asyncio.Queue(), asyncio.Queue()
            pumps = [
                asyncio.create_task(self._read(client_r, up, "up_delay")),
                asyncio.create_task(self._write(up, server_w)),
                asyncio.create_task(self._read(server_r, down, "down_delay")),
                asyncio.create_task(self._write(down, client_w)),
            ]
            try:
                done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
            for pump in done:
                pump.result()  # re-raise a pump's failure
            clean = True
        except (OSError, asyncio.CancelledError):
            # A reset or refused connection ends the link like any other close, and
            # cancellation is how cut() and stop() drop it: the task ends normally.
            pass
        finally:
            self._links.discard(link)
            for writer in writers:
                if clean:
                    writer.close()  # both sides sent EOF: flush what is buffered
                else:
                    writer.transport.abort()

    async def _read(self, reader: asyncio.StreamReader, queue: asyncio.Queue, delay_attr: str) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(_CHUNK)
            queue.put_nowait((loop.time() + getattr(self, delay_attr), data))
            if not data:
                return

    async def _write(self, queue: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._flowing.wait()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
