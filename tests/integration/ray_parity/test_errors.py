"""A user's exception raised in a downstream deployment is caught upstream by its own class, as in
Ray (issue 40, item 5): matched by module and name, nothing unpickled from the network; one the
caller's code does not define keeps its name, with the remote traceback in the message."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
from starlette.requests import Request

from modelplex import serve
from modelplex.handles import DeploymentHandle
from modelplex.wire.errors import HandlerError

from support.stacks import consecutive_free_ports

# Shipped to the replicas by value, as a script's classes are (tests/ is not on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class InsufficientFunds(Exception):
    def __init__(self, wanted: int, balance: int):
        super().__init__(f"cannot withdraw {wanted}: the balance is {balance}")


@serve.deployment
class Bank:
    def withdraw(self, amount: int) -> int:
        if amount > 10:
            raise InsufficientFunds(amount, 10)
        return 10 - amount

    def crash(self) -> None:
        exec("class Unshared(Exception): pass\nraise Unshared('nobody upstream knows me')")


@serve.deployment
class Teller:
    def __init__(self, bank: DeploymentHandle):
        self.bank = bank

    async def __call__(self, request: Request) -> str:
        amount = int(request.query_params["amount"])
        try:
            return f"left {await self.bank.withdraw.remote(amount)}"
        except InsufficientFunds as error:  # the downstream's class, caught in this replica
            return f"refused: {error}"


async def test_a_downstream_users_exception_is_caught_upstream_by_its_own_class():
    import aiohttp

    port = consecutive_free_ports(1)
    try:
        serve.run(Teller.bind(Bank.bind()), _port=port)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            async with session.get(f"http://127.0.0.1:{port}/?amount=50") as response:
                text = await response.text()
                assert response.status == 200
                assert text.startswith("refused: bank: InsufficientFunds: cannot withdraw 50: the balance is 10")
                assert "in withdraw" in text and "modelplex_replica" not in text  # the user's frames only
            async with session.get(f"http://127.0.0.1:{port}/?amount=3") as response:
                assert await response.text() == "left 7"
        bank = serve.get_deployment_handle("Bank")
        with pytest.raises(InsufficientFunds):  # in the script too
            await bank.withdraw.remote(11)
        with pytest.raises(HandlerError) as raised:  # a class only the downstream has: Ray's wrapper
            await bank.crash.remote()
        assert type(raised.value).__name__ == "Unshared"
        assert "nobody upstream knows me" in str(raised.value) and "Traceback" in str(raised.value)
        assert 'in crash' in str(raised.value)  # where it was raised, downstream
    finally:
        serve.shutdown()
