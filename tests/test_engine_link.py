"""The engine link's frames: a turn's messages travel as one frame, and a reply that cannot be
pickled reaches its caller as an error rather than never (the rest of that turn's messages intact);
a turn's responses are recorded in one message."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.text.subword import SubwordEncoder, load_tokenizer
from nerserve.service.api.errors import ApiError
from nerserve.service.api.extraction import ExtractionQuery
from nerserve.service.api.state import ServiceState
from nerserve.service.config import Settings
from nerserve.service.engine_link import LENGTH, EngineAddress, FrameReader, FrameWriter, PerTurn, RemoteEngine
from nerserve.service.pipeline import Planner


class CapturedWrites:
    """What a FrameWriter writes, in place of a socket's StreamWriter."""

    def __init__(self) -> None:
        self.data = bytearray()

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.data += data


def frame_count(data: bytes) -> int:
    frames, offset = 0, 0
    while offset < len(data):
        (size,) = LENGTH.unpack_from(data, offset)
        offset += LENGTH.size + size
        frames += 1
    return frames


async def written(messages: list[Any]) -> bytes:
    """The bytes one turn of sends writes."""
    out = CapturedWrites()
    writer = FrameWriter(out)  # type: ignore[arg-type]
    for message in messages:
        writer.send(message)
    await asyncio.sleep(0)  # the turn ends: the writer flushes
    return bytes(out.data)


async def read_back(data: bytes) -> list[Any]:
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    return await FrameReader(stream).read()


def test_a_turns_messages_are_one_frame() -> None:
    messages = [("reply", 1, True, {"a": 1}), ("records", None, ([("span-conll03", 200, None, 0.01)],)), ("release", None, ())]

    async def scenario() -> tuple[bytes, list[Any]]:
        data = await written(messages)
        return data, await read_back(data)

    data, received = asyncio.run(scenario())
    assert frame_count(data) == 1 and received == messages


def test_an_unpicklable_reply_is_answered_as_an_error_and_the_others_still_go() -> None:
    messages = [("reply", 7, True, lambda: None), ("reply", 8, True, "fine"), ("records", None, ([("m", 200, None, None)],))]

    async def scenario() -> list[Any]:
        return await read_back(await written(messages))

    failed, fine, record = asyncio.run(scenario())
    assert failed[:3] == ("reply", 7, False) and failed[3][0] == "internal"
    assert fine == messages[1] and record == messages[2]


def test_the_responses_of_a_turn_are_told_in_one_message() -> None:
    told: list[list[Any]] = []

    async def scenario() -> None:
        records = PerTurn[tuple[str, int, str | None, float]](told.append)
        for status in (200, 200, 429):
            records.add(("span-conll03", status, None, 0.01))
        await asyncio.sleep(0)  # the turn ends
        records.add(("span-conll03", 200, "team-a", 0.02))
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert told == [
        [("span-conll03", 200, None, 0.01), ("span-conll03", 200, None, 0.01), ("span-conll03", 429, None, 0.01)],
        [("span-conll03", 200, "team-a", 0.02)],
    ]


def test_a_worker_asks_before_reading_for_a_while_after_a_refusal() -> None:
    """A small body is admitted with its run, a large one is asked about first; once the engine has
    refused one of its requests, the worker asks first for every body for a while (a flood is then
    refused unread), and then admits small ones with their runs again."""
    from nerserve.service.admission import Refusal
    from nerserve.service.api.state import ServiceState
    from nerserve.service.config import Settings
    from nerserve.service.engine_link import ASK_FIRST_SECONDS, EngineAddress, RemoteEngine

    asked: list[str] = []

    async def refusing(method: str, *args: Any) -> Refusal:
        asked.append(method)
        return Refusal(wait=3.0, in_flight=10, bound=1.0)

    async def scenario() -> None:
        remote = RemoteEngine(EngineAddress("/nowhere", 0), ServiceState(Settings()))
        remote._call = refusing  # type: ignore[method-assign]
        assert await remote.admit("span-conll03", "", 200) is None and asked == []
        assert await remote.admit("span-conll03", "", 10_000) is not None and asked == ["admit"]
        assert await remote.admit("span-conll03", "", 200) is not None and asked == ["admit", "admit"]
        remote.refused_at -= ASK_FIRST_SECONDS
        assert await remote.admit("span-conll03", "", 200) is None and len(asked) == 2

    asyncio.run(scenario())


def test_the_engine_answers_a_workers_run_from_its_callback_and_cancels_it_on_request() -> None:
    """A run_planned starts as it is read and is answered when its run settles: its answers, a
    refusal raised at once, a malformed call, or client_gone once the worker cancels it."""
    from nerserve.service.api.errors import ApiError
    from nerserve.service.api.extraction import PlannedRun, UnitAnswers
    from nerserve.service.batching.work import Answer, ItemResult
    from nerserve.service.engine_link import EngineServer, _Worker

    async def scenario() -> list[Any]:
        runs: dict[str, PlannedRun] = {}
        answers: dict[str, list[Answer]] = {}

        class Engine:
            def start_planned(self, model: str, query: str, tenant: str, on_done: Any, admitted: bool) -> PlannedRun:
                if query == "refused":
                    raise ApiError("queue_full", "overloaded")
                runs[query] = PlannedRun(1, None, on_done)
                answers[query] = runs[query].answers()
                return runs[query]

        out = CapturedWrites()
        worker = _Worker(FrameWriter(out))  # type: ignore[arg-type]
        server = EngineServer(Engine())  # type: ignore[arg-type]
        server._dispatch(worker, "run_planned", 1, ("m", "answered", "", True))
        server._dispatch(worker, "run_planned", 2, ("m", "refused", "", True))
        server._dispatch(worker, "run_planned", 3, ("m", "left", "", True))
        server._dispatch(worker, "run_planned", 4, ("m",))  # malformed: an error, the link goes on
        assert set(worker.watching) == {1, 3}
        answers["answered"][0].set_result(ItemResult("entities", 0.01, 0.02, 1))
        server._dispatch(worker, "cancel", None, (3,))
        await asyncio.sleep(0)
        assert worker.watching == {} and answers["left"][0].done()  # the batcher drops it
        await asyncio.sleep(0)
        return await read_back(bytes(out.data))

    replies = {message[1]: message for message in asyncio.run(scenario())}
    assert replies[1][2] is True and isinstance(replies[1][3], UnitAnswers) and replies[1][3].entities == ["entities"]
    assert replies[2][2:4] == (False, ("queue_full", "overloaded", None, {}))
    assert replies[3][3][0] == "client_gone"
    assert replies[4][2] is False and replies[4][3][0] == "internal"


def test_a_worker_abandons_the_run_of_a_client_gone() -> None:
    """The client goes away before the engine answers: its request ends as client_gone at once,
    the engine is told to cancel that run, and the engine's late reply is dropped."""
    planner = Planner(SubwordEncoder(load_tokenizer(resolve_backbone().path)), window_subwords=128, overlap_words=2)

    async def planner_of(model: str) -> Planner:
        return planner

    async def scenario() -> tuple[str, list[str]]:
        engine = RemoteEngine(EngineAddress(Path("unused"), os.getpid()), ServiceState(Settings(models="span-conll03")))
        out = CapturedWrites()
        engine.out = FrameWriter(out)  # type: ignore[arg-type]
        engine.planner = planner_of  # type: ignore[method-assign]
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        request = asyncio.create_task(engine.extract("span-conll03", ExtractionQuery(texts=["Peter went."]), "", gone))
        while not engine.pending:  # planned and sent
            await asyncio.sleep(0)
        (call_id,) = engine.pending
        gone.set_result(None)
        with pytest.raises(ApiError) as ended:
            await request
        await asyncio.sleep(0)  # the turn ends: the writer flushes
        engine._handle(("reply", call_id, True, None))  # late: nobody waits for it any more
        sent = [message for frame in [await read_back(bytes(out.data))] for message in frame]
        return ended.value.code, [message[0] for message in sent]

    code, sent_kinds = asyncio.run(scenario())
    assert code == "client_gone"
    assert sent_kinds == ["run_planned", "cancel"]
