"""tau2 airline's database and 14 tools against hand-computed cases of the airline specification
(sections 1-3, 5.2, 7): exact contents, error texts, number types, quirks and partial writes."""

import json

import pydantic
import pytest

from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.airline import db as airline_db
from jaxagent.envs.tau2.domains.airline.db import INITIAL_HASH, canonicalize_db, load_db
from jaxagent.envs.tau2.domains.airline.tools import (
    PYDANTIC_REFERENCE_VERSION,
    READ_TOOLS,
    TOOL_SCHEMAS_FILE,
    WRITE_TOOLS,
    AirlineTools,
    execute,
    tool_schemas,
)

RES = "4WQ150"     # chen_jackson_3290, business round trip DFW-LAX, 3 passengers, paid 4986 by gift card
CHEN, CHEN_GC = "chen_jackson_3290", "gift_card_3576581"          # gift card balance 245.0
MEI = "mei_hernandez_8984"                                         # gold member
MEI_GC, MEI_CC, MEI_CERT = "gift_card_5309492", "credit_card_2140654", "certificate_7502997"  # 98.0, -, 250.0
ONE_PAX = {"first_name": "Mei", "last_name": "Hernandez", "dob": "1980-01-01"}


@pytest.fixture
def db():
    return load_db()


def ok(db, name, **args):
    res = execute(db, name, args)
    assert not res.error, res.content
    return res.content


def err(db, name, **args):
    res = execute(db, name, args)
    assert res.error, res.content
    return res.content


def booking(**over):
    args = {"user_id": MEI, "origin": "PHL", "destination": "LGA", "flight_type": "one_way", "cabin": "economy",
                "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}], "passengers": [ONE_PAX],
                "payment_methods": [{"payment_id": MEI_CC, "amount": 137}], "total_baggages": 0, "nonfree_baggages": 0,
                "insurance": "no"}
    args.update(over)
    return args


# --------------------------------------------------------------------------------------------- database
def test_initial_hash_and_canonical_order(db):
    assert db_hash(db) == INITIAL_HASH
    assert list(db) == ["flights", "users", "reservations"]
    assert list(db["flights"]["HAT001"])[:3] == ["flight_number", "origin", "destination"]
    res = db["reservations"][RES]
    assert list(res)[-1] == "status" and res["status"] is None
    assert list(res["flights"][0]) == ["flight_number", "origin", "destination", "date", "price"]
    assert len(db["flights"]) == 300 and len(db["users"]) == 500 and len(db["reservations"]) == 2000


def test_load_db_hands_out_independent_copies(db):
    db["users"][CHEN]["payment_methods"][CHEN_GC]["amount"] = 0.0
    assert db_hash(load_db()) == INITIAL_HASH


def test_canonicalize_names_the_bad_field():
    with pytest.raises(ValueError, match=r"top-level keys \['flights'\].*missing \['users', 'reservations'\]"):
        canonicalize_db({"flights": {}})
    with pytest.raises(ValueError, match=r"reservations\['X'\]: field 'status' is 'open'"):
        canonicalize_db({"flights": {}, "users": {}, "reservations": {"X": dict(
            {f: 0 for f in airline_db.RESERVATION_REQUIRED_FIELDS}, flights=[], status="open")}})
    with pytest.raises(ValueError, match=r"flights\['HAT9'\]: field 'flight_number' is 'HAT8'; expected its key"):
        canonicalize_db({"flights": {"HAT9": {f: "HAT8" if f == "flight_number" else {} for f in
                                              airline_db.FLIGHT_FIELDS}}, "users": {}, "reservations": {}})


# --------------------------------------------------------------------------------------------- schemas, dispatch
def test_schemas_are_taus_file_byte_for_byte():
    served = json.dumps(list(tool_schemas()))
    assert served == json.dumps(json.loads(TOOL_SCHEMAS_FILE.read_text())["tools"])
    names = [s["function"]["name"] for s in tool_schemas()]
    assert names[0] == "book_reservation" and names[-1] == "get_flight_status" and len(names) == 14
    assert "think" not in names
    assert set(names) == WRITE_TOOLS | READ_TOOLS | {"calculate", "transfer_to_human_agents"}


def test_dispatch_errors(db):
    assert err(db, "think", thought="x") == "Error: Tool 'think' not found."
    assert err(db, "get_reservation_details") == ("Error: AirlineTools.get_reservation_details() missing 1 required "
                                                  "positional argument: 'reservation_id'")
    assert err(db, "get_user_details", user_id=CHEN, verbose=True) == (
        "Error: AirlineTools.get_user_details() got an unexpected keyword argument 'verbose'")


# --------------------------------------------------------------------------------------------- read tools
def test_lookups_are_exact_and_name_the_id(db):
    assert err(db, "get_user_details", user_id=123) == "Error: User 123 not found"
    assert err(db, "get_reservation_details", reservation_id="4wq150") == "Error: Reservation 4wq150 not found"
    assert err(db, "get_flight_status", flight_number="HAT999", date="2024-05-20") == "Error: Flight HAT999 not found"
    assert err(db, "get_flight_status", flight_number="HAT001", date="2024-06-01") == (
        "Error: Flight HAT001 not found on date 2024-06-01")
    assert err(db, "get_user_details", user_id=["x"]) == "Error: unhashable type: 'list'"


def test_reservation_renders_every_field_in_canonical_order(db):
    text = ok(db, "get_reservation_details", reservation_id=RES)
    assert text.startswith('{"reservation_id": "4WQ150", "user_id": "chen_jackson_3290", "origin": "DFW", '
                           '"destination": "LAX", "flight_type": "round_trip", "cabin": "business", "flights": '
                           '[{"flight_number": "HAT170", "origin": "DFW", "destination": "LAX", "date": "2024-05-22", '
                           '"price": 883}')
    assert text.endswith('"created_at": "2024-05-02T03:10:19", "total_baggages": 5, "nonfree_baggages": 0, '
                         '"insurance": "no", "status": null}')
    user = ok(db, "get_user_details", user_id=CHEN)
    assert '"payment_methods": {"gift_card_3576581": {"source": "gift_card", "id": "gift_card_3576581", ' \
           '"amount": 245.0}}' in user


def test_flight_status_is_a_bare_word(db):
    assert ok(db, "get_flight_status", flight_number="HAT001", date="2024-05-01") == "landed"
    assert ok(db, "get_flight_status", flight_number="HAT001", date="2024-05-20") == "available"


def test_list_all_airports(db):
    airports = json.loads(ok(db, "list_all_airports"))
    assert len(airports) == 20 and airports[0] == {"iata": "SFO", "city": "San Francisco"}
    assert airports[-1] == {"iata": "LGA", "city": "LaGuardia"}


def test_direct_search(db):
    hits = json.loads(ok(db, "search_direct_flight", origin="PHL", destination="LGA", date="2024-05-20"))
    assert hits[0] == {"flight_number": "HAT001", "origin": "PHL", "destination": "LGA", "status": "available",
                       "scheduled_departure_time_est": "06:00:00", "scheduled_arrival_time_est": "07:00:00",
                       "date": None, "available_seats": {"basic_economy": 10, "economy": 17, "business": 13},
                       "prices": {"basic_economy": 61, "economy": 137, "business": 411}}
    assert list(hits[0]) == ["flight_number", "origin", "destination", "status", "scheduled_departure_time_est",
                             "scheduled_arrival_time_est", "date", "available_seats", "prices"]
    # unknown airport, a date that is not available, wrong case: [] (not an error)
    for args in ({"origin": "XXX", "destination": "LGA", "date": "2024-05-20"},
                 {"origin": "PHL", "destination": "LGA", "date": "2024-05-01"},
                 {"origin": "phl", "destination": "LGA", "date": "2024-05-20"}):
        assert ok(db, "search_direct_flight", **args) == "[]"


def test_direct_search_reflects_seats_booked_in_the_episode(db):
    ok(db, "book_reservation", **booking())
    hits = json.loads(ok(db, "search_direct_flight", origin="PHL", destination="LGA", date="2024-05-20"))
    assert hits[0]["available_seats"]["economy"] == 16


def _naive_onestop(db, origin, destination, date):
    """The spec's section 2.2 steps, written out independently."""
    out = []
    flights = list(db["flights"].values())
    for f in flights:
        if f["origin"] != origin or date not in f["dates"] or f["dates"][date]["status"] != "available":
            continue
        d2 = "2024-05-" + str(int(date[-2:]) + 1) if "+1" in f["scheduled_arrival_time_est"] else date
        for g in flights:
            if (g["origin"] == f["destination"] and g["destination"] == destination and d2 in g["dates"]
                    and g["dates"][d2]["status"] == "available"
                    and g["scheduled_departure_time_est"] >= f["scheduled_arrival_time_est"]):
                out.append((f["flight_number"], date, g["flight_number"], d2))
    return out


@pytest.mark.parametrize("origin,destination,date", [("JFK", "SFO", "2024-05-20"), ("LGA", "LAX", "2024-05-18"),
                                                     ("SEA", "BOS", "2024-05-25"), ("LAX", "MIA", "2024-05-30"),
                                                     ("LGA", "DTW", "2024-05-18")])
def test_onestop_search_against_a_naive_scan(db, origin, destination, date):
    pairs = json.loads(ok(db, "search_onestop_flight", origin=origin, destination=destination, date=date))
    got = [(a["flight_number"], a["date"], b["flight_number"], b["date"]) for a, b in pairs]
    assert got == _naive_onestop(db, origin, destination, date)
    assert all(len(p) == 2 for p in pairs)


def test_onestop_overnight_connection_date_is_literal_text(db):
    # HAT002 LGA->PHX arrives 01:30:00+1: the connection is searched on day + 1, compared as text
    pairs = json.loads(ok(db, "search_onestop_flight", origin="LGA", destination="SFO", date="2024-05-18"))
    overnight = [(a, b) for a, b in pairs if a["flight_number"] == "HAT002"]
    assert overnight and all(b["date"] == "2024-05-19" for _, b in overnight)
    assert all(b["scheduled_departure_time_est"] >= "01:30:00+1" for _, b in overnight)
    # on 05-30 the connection date is 2024-05-31, which no flight has: no overnight pair
    late = json.loads(ok(db, "search_onestop_flight", origin="LGA", destination="SFO", date="2024-05-30"))
    assert not [a for a, _ in late if "+1" in a["scheduled_arrival_time_est"]]


# --------------------------------------------------------------------------------------------- generic tools
@pytest.mark.parametrize("expr,out", [("2 + 2", "4.0"), ("10 / 3", "3.33"), ("7 // 2", "3.0"), ("2 ** 10", "1024.0"),
                                      ("-5 * 1.005", "-5.02")])
def test_calculate(db, expr, out):
    assert ok(db, "calculate", expression=expr) == out


def test_calculate_errors_and_transfer(db):
    assert err(db, "calculate", expression="3,000") == "Error: Invalid characters in expression"
    assert err(db, "calculate", expression="1 / 0") == "Error: division by zero"
    assert err(db, "calculate", expression="2 +") == "Error: invalid syntax (<string>, line 1)"
    assert ok(db, "transfer_to_human_agents", summary="x") == "Transfer successful"
    assert db_hash(db) == INITIAL_HASH


# --------------------------------------------------------------------------------------------- book_reservation
def test_book_one_way(db):
    res = json.loads(ok(db, "book_reservation", **booking()))
    assert res == {"reservation_id": "HATHAT", "user_id": MEI, "origin": "PHL", "destination": "LGA",
                   "flight_type": "one_way", "cabin": "economy",
                   "flights": [{"flight_number": "HAT001", "origin": "PHL", "destination": "LGA", "date": "2024-05-20",
                                "price": 137}],
                   "passengers": [ONE_PAX], "payment_history": [{"payment_id": MEI_CC, "amount": 137}],
                   "created_at": "2024-05-15T15:00:00", "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no",
                   "status": None}
    assert list(db["reservations"])[-1] == "HATHAT"
    assert db["users"][MEI]["reservations"][-1] == "HATHAT"
    assert db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 16


def test_book_ids_are_fixed_and_run_out(db):
    ids = [json.loads(ok(db, "book_reservation", **booking()))["reservation_id"] for _ in range(3)]
    assert ids == ["HATHAT", "HATHAU", "HATHAV"]
    assert err(db, "book_reservation", **booking()) == "Error: Too many reservations"


def test_book_prices_insurance_and_bags(db):
    # 2 passengers x 137 + insurance 30 x 2 + 1 non-free bag 50 = 384; gift card 98.0 then credit card
    args = booking(passengers=[ONE_PAX, dict(ONE_PAX, first_name="Ann")], insurance="yes", nonfree_baggages=1,
                   total_baggages=3, payment_methods=[{"payment_id": MEI_GC, "amount": 98},
                                                      {"payment_id": MEI_CC, "amount": 286}])
    res = json.loads(ok(db, "book_reservation", **args))
    assert res["payment_history"] == [{"payment_id": MEI_GC, "amount": 98}, {"payment_id": MEI_CC, "amount": 286}]
    gc = db["users"][MEI]["payment_methods"][MEI_GC]["amount"]
    assert gc == 0.0 and isinstance(gc, float)
    assert db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 15


def test_book_payment_errors_in_order(db):
    assert err(db, "book_reservation", **booking(payment_methods=[{"payment_id": MEI_CC, "amount": 136}])) == (
        "Error: Payment amount does not add up, total price is 137, but paid 136")
    assert err(db, "book_reservation", **booking(payment_methods=[])) == (
        "Error: Payment amount does not add up, total price is 137, but paid 0")
    assert err(db, "book_reservation", **booking(payment_methods=[{"payment_id": "credit_card_1", "amount": 137}])) == (
        "Error: Payment method credit_card_1 not found")
    assert err(db, "book_reservation", **booking(payment_methods=[{"payment_id": MEI_GC, "amount": 137}])) == (
        f"Error: Not enough balance in payment method {MEI_GC}")
    assert db_hash(db) == INITIAL_HASH


def test_book_flight_errors(db):
    assert err(db, "book_reservation", **booking(flights=[{"flight_number": "HAT999", "date": "2024-05-20"}])) == (
        "Error: Flight HAT999 not found")
    assert err(db, "book_reservation", **booking(flights=[{"flight_number": "HAT001", "date": "2024-06-20"}])) == (
        "Error: Flight HAT001 not found on date 2024-06-20")
    assert err(db, "book_reservation", **booking(flights=[{"flight_number": "HAT001", "date": "2024-05-10"}])) == (
        "Error: Flight HAT001 not available on date 2024-05-10")
    db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] = 0
    assert err(db, "book_reservation", **booking()) == "Error: Not enough seats on flight HAT001"


def test_book_validation_before_user_lookup_and_lax_coercion(db):
    text = err(db, "book_reservation", **booking(user_id="nobody", passengers=[{"first_name": "A", "last_name": "B"}]))
    assert text.startswith("Error: 1 validation error for Passenger\ndob\n  Field required [type=missing")
    assert f"https://errors.pydantic.dev/{PYDANTIC_REFERENCE_VERSION}/v/missing" in text
    frac = err(db, "book_reservation", **booking(payment_methods=[{"payment_id": MEI_CC, "amount": 136.5}]))
    assert frac.startswith("Error: 1 validation error for Payment\namount\n  Input should be a valid integer, got a "
                           "number with a fractional part")
    # 137.0 is accepted as the int 137; extra keys are dropped; a bag count of 1.0 is stored as 1
    res = json.loads(ok(db, "book_reservation", **booking(
        payment_methods=[{"payment_id": MEI_CC, "amount": 187.0, "note": "x"}], nonfree_baggages=1.0,
        passengers=[dict(ONE_PAX, seat="1A")])))
    assert res["payment_history"] == [{"payment_id": MEI_CC, "amount": 187}]
    assert res["nonfree_baggages"] == 1 and type(res["nonfree_baggages"]) is int
    assert res["passengers"] == [ONE_PAX]
    assert err(db, "book_reservation", **booking(cabin="first")).startswith(
        "Error: 1 validation error for Reservation\ncabin\n  Input should be 'business', 'economy' or 'basic_economy'")
    assert err(db, "book_reservation", **booking(user_id="nobody")) == "Error: User nobody not found"


def test_book_matches_pydantic_itself():
    """Our messages are pydantic's own, the documentation link set to the reference version."""
    class Passenger(pydantic.BaseModel):
        first_name: str
        last_name: str
        dob: str

    with pytest.raises(pydantic.ValidationError) as info:
        Passenger(first_name=1, last_name="B", dob="x")
    expected = "Error: " + str(info.value).replace(f"/{pydantic.VERSION.rsplit('.', 1)[0]}/",
                                                   f"/{PYDANTIC_REFERENCE_VERSION}/")
    got = execute(load_db(), "update_reservation_passengers",
                  {"reservation_id": RES, "passengers": [{"first_name": 1, "last_name": "B", "dob": "x"}]}).content
    assert got == expected


def test_book_repeated_gift_card_goes_negative_and_certificate_is_consumed(db):
    # each entry alone fits the 98.0 balance: both pass, the card is debited twice
    ok(db, "book_reservation", **booking(payment_methods=[{"payment_id": MEI_GC, "amount": 68},
                                                          {"payment_id": MEI_GC, "amount": 69}]))
    assert db["users"][MEI]["payment_methods"][MEI_GC]["amount"] == -39.0
    # a certificate pays in full and disappears (its unused value is lost)
    ok(db, "book_reservation", **booking(payment_methods=[{"payment_id": MEI_CERT, "amount": 137}]))
    assert MEI_CERT not in db["users"][MEI]["payment_methods"]


def test_book_repeated_certificate_is_a_partial_write(db):
    cc = {"payment_id": MEI_CC, "amount": 37}
    args = booking(flights=[{"flight_number": "HAT001", "date": "2024-05-20"}],
                   payment_methods=[{"payment_id": "gift_card_5309492", "amount": 0}, {"payment_id": MEI_CERT,
                                                                                       "amount": 50},
                                    {"payment_id": MEI_CERT, "amount": 50}, cc])
    assert err(db, "book_reservation", **args) == f"Error: '{MEI_CERT}'"
    assert MEI_CERT not in db["users"][MEI]["payment_methods"]          # removed by the first entry
    assert "HATHAT" not in db["reservations"]                            # no reservation, no seats
    assert db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 17


def test_book_raw_lists_are_used_unvalidated(db):
    assert err(db, "book_reservation", **booking(flights=["HAT001"])) == (
        "Error: 'str' object has no attribute 'flight_number'")
    assert err(db, "book_reservation", **booking(flights=5)) == "Error: 'int' object is not iterable"
    # an empty flight list books a reservation without segments
    res = json.loads(ok(db, "book_reservation", **booking(flights=[], payment_methods=[])))
    assert res["flights"] == [] and res["payment_history"] == []


# --------------------------------------------------------------------------------------------- cancel
def test_cancel_appends_negations_and_changes_nothing_else(db):
    res = json.loads(ok(db, "cancel_reservation", reservation_id=RES))
    assert res["status"] == "cancelled"
    assert res["payment_history"] == [{"payment_id": CHEN_GC, "amount": 4986}, {"payment_id": CHEN_GC, "amount": -4986}]
    assert db["users"][CHEN]["payment_methods"][CHEN_GC]["amount"] == 245.0
    res = json.loads(ok(db, "cancel_reservation", reservation_id=RES))
    assert [p["amount"] for p in res["payment_history"]] == [4986, -4986, -4986, 4986]
    assert err(db, "cancel_reservation", reservation_id="ZZZZZZ") == "Error: Reservation ZZZZZZ not found"


# --------------------------------------------------------------------------------------------- baggages
def test_baggages_price_and_payment(db):
    res = json.loads(ok(db, "update_reservation_baggages", reservation_id=RES, total_baggages=7, nonfree_baggages=2,
                        payment_id=CHEN_GC))
    assert res["payment_history"][-1] == {"payment_id": CHEN_GC, "amount": 100}
    assert db["users"][CHEN]["payment_methods"][CHEN_GC]["amount"] == 145.0
    assert (res["total_baggages"], res["nonfree_baggages"]) == (7, 2)
    # reducing never refunds; a float count is stored as given (and hashes differently from the int)
    res = json.loads(ok(db, "update_reservation_baggages", reservation_id=RES, total_baggages=3.0, nonfree_baggages=1,
                        payment_id=CHEN_GC))
    assert len(res["payment_history"]) == 2 and res["total_baggages"] == 3.0
    assert type(db["reservations"][RES]["total_baggages"]) is float


def test_baggages_payment_errors(db):
    base = {"reservation_id": RES, "total_baggages": 5, "nonfree_baggages": 0}
    assert err(db, "update_reservation_baggages", **base, payment_id="credit_card_0") == (
        "Error: Payment method not found")
    assert err(db, "update_reservation_baggages", **dict(base, nonfree_baggages=5), payment_id=CHEN_GC) == (
        "Error: Gift card balance is not enough")
    db["users"][CHEN]["payment_methods"]["certificate_1"] = {"source": "certificate", "id": "certificate_1",
                                                             "amount": 100.0}
    assert err(db, "update_reservation_baggages", **base, payment_id="certificate_1") == (
        "Error: Certificate cannot be used to update reservation")   # even at price 0


# --------------------------------------------------------------------------------------------- flights
def _flights(*pairs):
    return [{"flight_number": n, "date": d} for n, d in pairs]


SAME = _flights(("HAT170", "2024-05-22"), ("HAT022", "2024-05-26"))


def test_update_flights_same_itinerary_is_a_noop(db):
    text = ok(db, "update_reservation_flights", reservation_id=RES, cabin="business", flights=SAME, payment_id=CHEN_GC)
    assert json.loads(text) == db["reservations"][RES] and db_hash(db) == INITIAL_HASH


def test_update_flights_reorder_and_empty(db):
    ok(db, "update_reservation_flights", reservation_id=RES, cabin="business", flights=SAME[::-1], payment_id=CHEN_GC)
    assert [s["flight_number"] for s in db["reservations"][RES]["flights"]] == ["HAT022", "HAT170"]
    assert db_hash(db) != INITIAL_HASH and len(db["reservations"][RES]["payment_history"]) == 1
    res = json.loads(ok(db, "update_reservation_flights", reservation_id=RES, cabin="business", flights=[],
                        payment_id=CHEN_GC))
    assert res["flights"] == [] and res["payment_history"][-1] == {"payment_id": CHEN_GC, "amount": -(883 + 779) * 3}
    assert db["users"][CHEN]["payment_methods"][CHEN_GC]["amount"] == 245.0 + (883 + 779) * 3


def test_update_flights_cabin_change_reprices_every_segment(db):
    day22 = db["flights"]["HAT170"]["dates"]["2024-05-22"]
    day26 = db["flights"]["HAT022"]["dates"]["2024-05-26"]
    diff = (day22["prices"]["economy"] + day26["prices"]["economy"] - 883 - 779) * 3
    res = json.loads(ok(db, "update_reservation_flights", reservation_id=RES, cabin="economy", flights=SAME,
                        payment_id=CHEN_GC))
    assert res["cabin"] == "economy" and res["payment_history"][-1]["amount"] == diff < 0
    assert db["users"][CHEN]["payment_methods"][CHEN_GC]["amount"] == 245.0 - diff
    assert day22["available_seats"] == load_db()["flights"]["HAT170"]["dates"]["2024-05-22"]["available_seats"]


def test_update_flights_errors(db):
    assert err(db, "update_reservation_flights", reservation_id=RES, cabin="first",
               flights=_flights(("HAT170", "2024-05-23")), payment_id=CHEN_GC) == "Error: 'first'"
    assert err(db, "update_reservation_flights", reservation_id=RES, cabin="business",
               flights=_flights(("HAT170", "2024-05-10")), payment_id=CHEN_GC) == (
        "Error: Flight HAT170 not available on date 2024-05-10")
    assert err(db, "update_reservation_flights", reservation_id="NOPE00", cabin="business", flights=[{"date": "x"}],
               payment_id=CHEN_GC).startswith("Error: 1 validation error for FlightInfo\nflight_number")
    assert err(db, "update_reservation_flights", reservation_id=RES, cabin="business", flights=SAME,
               payment_id="credit_card_0") == "Error: Payment method not found"
    assert db_hash(db) == INITIAL_HASH


# --------------------------------------------------------------------------------------------- passengers
def test_update_passengers(db):
    new = [dict(ONE_PAX, first_name=str(i)) for i in range(3)]
    res = json.loads(ok(db, "update_reservation_passengers", reservation_id=RES, passengers=new))
    assert res["passengers"] == new
    assert err(db, "update_reservation_passengers", reservation_id=RES, passengers=new[:2]) == (
        "Error: Number of passengers does not match")


# --------------------------------------------------------------------------------------------- certificates
def test_send_certificate(db):
    assert ok(db, "send_certificate", user_id=CHEN, amount=150) == (
        f"Certificate certificate_3221322 added to user {CHEN} with amount 150.")
    assert db["users"][CHEN]["payment_methods"]["certificate_3221322"] == {
        "source": "certificate", "id": "certificate_3221322", "amount": 150.0}
    assert ok(db, "send_certificate", user_id=CHEN, amount=12.5).endswith("with amount 12.5.")
    assert ok(db, "send_certificate", user_id=CHEN, amount=100.0).endswith("certificate_3221324 added to user "
                                                                           f"{CHEN} with amount 100.0.")
    assert err(db, "send_certificate", user_id=CHEN, amount=1) == "Error: Too many certificates"
    assert list(db["users"][CHEN]["payment_methods"])[-1] == "certificate_3221324"


def test_send_certificate_reuses_an_id_freed_by_a_booking(db):
    ok(db, "send_certificate", user_id=MEI, amount=137)
    ok(db, "book_reservation", **booking(payment_methods=[{"payment_id": "certificate_3221322", "amount": 137}]))
    assert ok(db, "send_certificate", user_id=MEI, amount=5).startswith("Certificate certificate_3221322 added")


# --------------------------------------------------------------------------------------------- environment functions
def test_environment_helpers(db):
    tools = AirlineTools(db)
    assert tools._get_new_reservation_id() == "HATHAT"
    assert tools._get_new_payment_id() == [3221322, 3221323, 3221324]
    assert tools._get_datetime() == "2024-05-15T15:00:00"
    assert tools._get_flight_instance("HAT001", "2024-05-01")["status"] == "landed"
    with pytest.raises(AttributeError, match="'dict' object has no attribute 'payment_methods'"):
        tools._payment_for_update({"payment_methods": {}}, CHEN_GC, 0)
    with pytest.raises(AttributeError, match="'dict' object has no attribute 'flight_number'"):
        tools._get_flights_from_flight_infos([{"flight_number": "HAT001", "date": "2024-05-20"}])
    late = tools._search_direct_flight("2024-05-20", origin="PHL", leave_after="12:00:00")
    assert late and all(f["scheduled_departure_time_est"] >= "12:00:00" for f in late)


# --------------------------------------------------------------------------------------------- a second reading's finds
def test_a_record_key_named_model_is_dropped_like_any_extra_key(db):
    pax = [dict(ONE_PAX, model="x")] * 3
    res = json.loads(ok(db, "update_reservation_passengers", reservation_id=RES, passengers=pax))
    assert res["passengers"] == [ONE_PAX] * 3
    assert err(db, "update_reservation_flights", reservation_id=RES, cabin="business", flights=[{"model": 1}],
               payment_id=CHEN_GC).startswith("Error: 2 validation errors for FlightInfo\nflight_number\n")


def test_arguments_named_like_make_tool_calls_parameters_fail_there_first(db):
    """tau2 runs make_tool_call(name, requestor=..., **arguments): requestor is reported first, then the
    first of self / tool_name, and before the tool lookup (an unknown tool too)."""
    mtc = "tau2.environment.environment.Environment.make_tool_call()"
    assert err(db, "get_user_details", user_id=CHEN, self=1, requestor="x") == (
        f"Error: {mtc} got multiple values for keyword argument 'requestor'")
    assert err(db, "get_user_details", tool_name=1, self=2) == (
        "Error: Environment.make_tool_call() got multiple values for argument 'tool_name'")
    assert err(db, "think", self=1) == "Error: Environment.make_tool_call() got multiple values for argument 'self'"
    assert err(db, "cancel_reservation", reservation_id=RES, requestor="assistant").endswith("'requestor'")
    assert db_hash(db) == INITIAL_HASH


def test_calculate_keeps_pythons_big_integers(db):
    assert ok(db, "calculate", expression="2 ** 200000 // 2 ** 199990") == "1024.0"
    assert ok(db, "calculate", expression="(2 ** 60000) * (2 ** 60000) // 2 ** 119990") == "1024.0"
    assert err(db, "calculate", expression="2 ** 100001") == "Error: int too large to convert to float"
    assert err(db, "calculate", expression="9 ** 9 ** 9").startswith("Error: Result too large to calculate")


def test_the_link_rewrite_leaves_the_input_value_alone(db):
    url = "https://errors.pydantic.dev/9/v/"
    text = err(db, "send_certificate", user_id=CHEN, amount=url)
    assert f"input_value='{url}'" in text
    assert text.endswith(f"For further information visit https://errors.pydantic.dev/{PYDANTIC_REFERENCE_VERSION}"
                         "/v/float_parsing")
