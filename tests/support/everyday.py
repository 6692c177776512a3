"""Everyday pandas, held against the frames a stage receives: one realistic table and the operations
a pandas user writes on it, each checking its own result so that a silently wrong answer fails too.

The operations are written as a pandas user writes them, never adapted to the dtypes they meet.
Expected values come from the table as written (`truth`, matched by `id`), not from the frame under
test, so that a frame which lost or changed values cannot agree with itself. No engine code here:
tests/engines/test_everyday_frames.py decides which frames run which operations.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import pyarrow as pa

UTC = dt.timezone.utc
PARIS = ZoneInfo("Europe/Paris")
START = dt.datetime(2026, 3, 26, tzinfo=UTC)  # 200 hours cross Europe's switch to summer time
CITIES = ("Paris", "Lyon", "Berlin", "Oslo")
COUNTRIES = {"Paris": "FR", "Lyon": "FR", "Berlin": "DE", "Oslo": "NO"}
FIRST = ("Ana", "Jean", "Lena", "Omar", "Chloé", "Björn", "Ingrid", "Marc")
LAST = ("Dubois", "Schmidt", "Hansen", "Martin", "Nakamura")
NUMBERS = ["qty", "price", "ratio", "flag"]  # the model features


def everyday_table(rows: int = 200, seed: int = 20260326) -> pa.Table:
    """Hourly orders: ints, floats and bools with and without nulls, strings, timestamps with and
    without a zone, a date, a decimal, and a 0/1 `label` that the numeric columns predict."""
    rng = np.random.default_rng(seed)
    ts = [START + dt.timedelta(hours=h) for h in range(rows)]
    qty = rng.integers(-5, 40, rows)  # negatives: % and // must floor as Python does
    price = np.round(rng.gamma(2.0, 8.0, rows) + 0.5, 2)
    ratio = rng.uniform(0.05, 1.0, rows).astype(np.float32)
    flag = rng.random(rows) < 0.4
    qty_null, price_null = rng.random(rows) < 0.1, rng.random(rows) < 0.1
    logit = -1.5 + 0.12 * np.where(qty_null, 0, qty) + 2.0 * flag - 3.0 * ratio + 0.04 * np.where(price_null, 0, price)
    names = [f"{a} {b}" for a, b in zip(rng.choice(FIRST, rows), rng.choice(LAST, rows))]
    cents = rng.integers(0, 1_000_000, rows)
    return pa.table({
        "id": pa.array(np.arange(1, rows + 1), pa.int64()),
        "qty": pa.array(qty.astype(np.int32), pa.int32(), mask=qty_null),
        "price": pa.array(price, pa.float64(), mask=price_null),
        "ratio": pa.array(ratio, pa.float32()),
        "flag": pa.array(flag, pa.bool_()),
        "maybe": pa.array(rng.random(rows) < 0.5, pa.bool_(), mask=rng.random(rows) < 0.15),
        "name": pa.array(names, pa.string(), mask=rng.random(rows) < 0.08),
        "city": pa.array(rng.choice(CITIES, rows, p=[0.4, 0.3, 0.2, 0.1]), pa.string()),
        "ts": pa.array(ts, pa.timestamp("us", "UTC")),
        "ts_naive": pa.array([t.astimezone(PARIS).replace(tzinfo=None) for t in ts], pa.timestamp("us")),
        "day": pa.array([t.date() for t in ts], pa.date32()),
        "amount": pa.array([Decimal(int(c)).scaleb(-2) for c in cents], pa.decimal128(10, 2),
                           mask=rng.random(rows) < 0.05),
        "label": pa.array((rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64), pa.int64()),
    })


@dataclass(frozen=True)
class Operation:
    name: str
    run: Callable[[Any], Any]
    columns: tuple[str, ...]  # what it reads: skipped on a frame that lacks one
    lazy: bool = False  # also written for a dask.dataframe: every result goes through collect()
    needs: tuple[str, ...] = ()  # optional libraries it imports


OPERATIONS: list[Operation] = []


def operation(*columns: str, lazy: bool = False, needs: tuple[str, ...] = ()):
    def register(run):
        OPERATIONS.append(Operation(run.__name__, run, columns, lazy, needs))
        return run
    return register


# ---------------------------------------------------------------- expected values

def collect(result):
    """A Dask result computed; a pandas or numpy one as it is."""
    compute = getattr(result, "compute", None)
    return compute() if callable(compute) else result


def truth(df, column: str) -> list:
    """The column as written (None for null), in the frame's row order."""
    table = everyday_table()
    written = dict(zip(table.column("id").to_pylist(), table.column(column).to_pylist()))
    return [written[i] for i in collect(df["id"]).tolist()]


def missing(value) -> bool:
    return value is None or (pd.api.types.is_scalar(value) and bool(pd.isna(value)))


def floats(values) -> np.ndarray:
    return np.array([np.nan if missing(v) else float(v) for v in list(values)], dtype=float)


def plain(values) -> list:
    """Python values with every kind of missing (None, nan, NA, NaT) as None."""
    return [None if missing(v) else v for v in list(values)]


def assert_close(actual, expected, rtol: float = 1e-9) -> None:
    a, e = floats(actual), floats(expected)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert np.array_equal(np.isnan(a), np.isnan(e)), "missing values differ"
    assert np.allclose(a, e, rtol=rtol, atol=1e-12, equal_nan=True), (a[:8], e[:8])


def by_group(keys, values, reduce) -> dict:
    """{key: reduce(non-null values of that key)}: the numpy answer a groupby must give."""
    values = floats(values)
    keys = np.array(keys, dtype=object)
    return {k: reduce(values[(keys == k) & ~np.isnan(values)]) for k in sorted(set(keys))}


def ts_order(df) -> pd.DataFrame:
    return df.sort_values("ts")  # time-series operations need time order; engines may not keep it


# ---------------------------------------------------------------- integer arithmetic

@operation("id", "qty", lazy=True)
def modulo(df):
    ids, qty = collect(df["id"] % 2), collect(df["qty"] % 2)
    assert set(ids.tolist()) <= {0, 1} and ids.sum() == sum(i % 2 for i in truth(df, "id"))
    assert plain(qty) == [None if q is None else q % 2 for q in truth(df, "qty")]
    return qty


@operation("id", "qty", lazy=True)
def floor_division(df):
    tens, thirds = collect(df["id"] // 10), collect(df["qty"] // 3)
    assert tens.tolist() == [i // 10 for i in truth(df, "id")]
    assert plain(thirds) == [None if q is None else q // 3 for q in truth(df, "qty")]
    return thirds


@operation("id", "qty")
def divmod_ints(df):
    for column in ("id", "qty"):
        whole, rest = divmod(df[column], 7)
        written = truth(df, column)
        assert plain(whole * 7 + rest) == written
        assert plain(rest) == [None if v is None else v % 7 for v in written]
    return whole, rest


# ---------------------------------------------------------------- arithmetic and comparisons

@operation("id", "qty", "price", "ratio", lazy=True)
def scalar_arithmetic(df):
    gross = collect(df["price"] * 1.2 + 3)
    assert_close(gross, floats(truth(df, "price")) * 1.2 + 3)
    assert plain(collect(df["qty"] * 2 - 1)) == [None if q is None else q * 2 - 1 for q in truth(df, "qty")]
    assert_close(collect(df["id"] / 4), floats(truth(df, "id")) / 4)
    assert_close(collect(df["ratio"] ** 2), floats(truth(df, "ratio")) ** 2, rtol=1e-6)
    return gross


@operation("id", "qty", "price")
def numpy_array_arithmetic(df):
    steps = np.arange(len(df))
    assert (df["id"] * steps).tolist() == [i * s for i, s in zip(truth(df, "id"), steps.tolist())]
    shifted = df["price"] + np.ones(len(df))
    assert_close(shifted, floats(truth(df, "price")) + 1)
    assert_close(df["qty"] - steps, floats(truth(df, "qty")) - steps)
    return shifted


@operation("price", "qty", "city", "ts", lazy=True)
def comparisons(df):
    price, qty = floats(truth(df, "price")), truth(df, "qty")
    assert collect((df["price"] > 10).sum()) == np.sum(price > 10)
    assert collect((df["qty"] == 3).sum()) == qty.count(3)
    assert collect((df["city"] == "Paris").sum()) == truth(df, "city").count("Paris")
    since = collect((df["ts"] >= pd.Timestamp("2026-03-28", tz="UTC")).sum())
    assert since == sum(t >= dt.datetime(2026, 3, 28, tzinfo=UTC) for t in truth(df, "ts"))
    cheap = collect(df[df["price"] <= 10])
    assert len(cheap) == np.sum(price <= 10)
    return cheap


@operation("flag", "maybe")
def boolean_logic(df):
    flag, maybe = truth(df, "flag"), truth(df, "maybe")
    assert (~df["flag"]).sum() == flag.count(False)
    assert (df["flag"] & df["maybe"]).sum() == sum(bool(f and m) for f, m in zip(flag, maybe))
    assert math.isclose(df["flag"].mean(), np.mean(flag))
    return df[df["flag"]]


# ---------------------------------------------------------------- groupby

@operation("city", "qty", "price", "id", lazy=True)
def groupby_agg(df):
    result = collect(df.groupby("city").agg(qty_sum=("qty", "sum"), price_mean=("price", "mean"),
                                            orders=("id", "count"), cheapest=("price", "min"),
                                            dearest=("price", "max")))
    city = truth(df, "city")
    expected = {
        "qty_sum": by_group(city, truth(df, "qty"), np.sum),
        "price_mean": by_group(city, truth(df, "price"), np.mean),
        "orders": by_group(city, truth(df, "id"), len),
        "cheapest": by_group(city, truth(df, "price"), np.min),
        "dearest": by_group(city, truth(df, "price"), np.max),
    }
    for column, answer in expected.items():
        got = result[column].sort_index()
        assert got.index.tolist() == list(answer), column
        assert_close(got, list(answer.values()))
    return result


@operation("city", "price")
def groupby_transform(df):
    mean = df.groupby("city")["price"].transform("mean")
    centred = df.groupby("city")["price"].transform(lambda s: s - s.mean())
    means = by_group(truth(df, "city"), truth(df, "price"), np.mean)
    assert_close(mean, [means[c] for c in truth(df, "city")])
    assert_close(centred, floats(truth(df, "price")) - floats(mean))
    return centred


@operation("city", "price")
def groupby_rank(df):
    ranks = df.groupby("city")["price"].rank(method="min")
    city, price = truth(df, "city"), floats(truth(df, "price"))
    expected = [np.nan if np.isnan(p) else 1 + sum(q < p for q, d in zip(price, city) if d == c)
                for p, c in zip(price, city)]
    assert_close(ranks, expected)
    return ranks


@operation("city", "ts", "qty")
def groupby_shift(df):
    ordered = ts_order(df)
    previous = ordered.groupby("city")["qty"].shift(1)
    last: dict[str, Any] = {}
    expected = []
    for c, q in zip(truth(ordered, "city"), truth(ordered, "qty")):
        expected.append(last.get(c))
        last[c] = q
    assert plain(previous) == expected
    return previous


# ---------------------------------------------------------------- windows and time

@operation("ts", "price")
def rolling_mean(df):
    ordered = ts_order(df)
    mean = ordered["price"].rolling(3).mean()
    price = floats(truth(ordered, "price"))
    expected = [np.nan if i < 2 else price[i - 2:i + 1].mean() for i in range(len(price))]
    assert_close(mean, expected)
    return mean


@operation("ts", "ratio")
def ewm_mean(df):
    ordered = ts_order(df)
    smooth = ordered["ratio"].ewm(span=3).mean()
    ratio = floats(truth(ordered, "ratio"))
    weights = 0.5 ** np.arange(len(ratio))  # span 3: alpha 1/2, adjusted weights
    expected = [np.dot(weights[:i + 1], ratio[i::-1]) / weights[:i + 1].sum() for i in range(len(ratio))]
    assert_close(smooth, expected, rtol=1e-6)
    return smooth


@operation("ts", "price", "qty")
def resample_daily(df):
    daily = df.resample("1D", on="ts").agg({"price": "sum", "qty": "sum"})
    days = [t.date() for t in truth(df, "ts")]
    assert [d.date() for d in daily.index] == sorted(set(days))
    assert_close(daily["price"], list(by_group(days, truth(df, "price"), np.sum).values()))
    assert_close(daily["qty"], list(by_group(days, truth(df, "qty"), np.sum).values()))
    return daily


@operation("ts", "id")
def merge_asof_on_ts(df):
    rates = pd.DataFrame({"ts": pd.date_range("2026-03-26", periods=40, freq="6h", tz="UTC"),
                          "rate": np.arange(40.0)})
    joined = pd.merge_asof(ts_order(df), rates, on="ts")
    expected = [(t - START) // dt.timedelta(hours=6) for t in truth(joined, "ts")]
    assert joined["rate"].tolist() == expected
    return joined


@operation("ts", "price")
def datetime_index(df):
    indexed = df.set_index("ts").sort_index()
    one_day = indexed.loc["2026-03-28"]
    assert len(one_day) == sum(t.date() == dt.date(2026, 3, 28) for t in truth(df, "ts"))
    by_3h = indexed["price"].rolling("3h").mean()
    assert len(by_3h) == len(df) and by_3h.notna().any()
    return one_day


@operation("ts", lazy=True)
def dt_on_utc_timestamps(df):
    ts = df["ts"]
    written = truth(df, "ts")
    assert collect(ts.dt.year).tolist() == [t.year for t in written]
    assert collect(ts.dt.day_of_week).tolist() == [t.weekday() for t in written]
    assert collect(ts.dt.floor("D")).tolist() == [t.replace(hour=0) for t in written]
    paris = collect(ts.dt.tz_convert("Europe/Paris"))
    assert paris.dt.hour.tolist() == [t.astimezone(PARIS).hour for t in written]
    return paris


@operation("ts_naive", "ts", lazy=True)
def dt_on_naive_timestamps(df):
    local = df["ts_naive"]
    written = truth(df, "ts_naive")
    assert collect(local.dt.year).tolist() == [t.year for t in written]
    assert collect(local.dt.day_of_week).tolist() == [t.weekday() for t in written]
    assert collect(local.dt.floor("h")).tolist() == written  # already on the hour
    back = collect(local.dt.tz_localize("Europe/Paris").dt.tz_convert("UTC"))
    assert back.tolist() == truth(df, "ts")
    elapsed = collect((local - local.min()).dt.total_seconds())
    assert elapsed.min() == 0 and elapsed.max() > 0
    return back


@operation("day")
def dates(df):
    days = truth(df, "day")
    assert (df["day"] == dt.date(2026, 3, 28)).sum() == days.count(dt.date(2026, 3, 28))
    as_datetime = pd.to_datetime(df["day"])
    assert as_datetime.dt.month.tolist() == [d.month for d in days]
    assert df["day"].max() == max(days)
    return as_datetime


# ---------------------------------------------------------------- categories, bins, dummies

@operation("price")
def cut_into_bins(df):
    edges = [0, 10, 20, 50, np.inf]
    bands = pd.cut(df["price"], bins=edges, labels=["low", "mid", "high", "top"])
    price = floats(truth(df, "price"))
    expected = [None if np.isnan(p) else ["low", "mid", "high", "top"][np.searchsorted(edges, p) - 1] for p in price]
    assert plain(bands) == expected
    assert bands.value_counts().sum() == np.sum(~np.isnan(price))
    return bands


@operation("city", "flag", "qty")
def get_dummies(df):
    dummies = pd.get_dummies(df["city"], prefix="city")
    assert sorted(dummies.columns) == [f"city_{c}" for c in sorted(set(truth(df, "city")))]
    assert (dummies.sum(axis=1) == 1).all()
    assert dummies["city_Paris"].sum() == truth(df, "city").count("Paris")
    wide = pd.get_dummies(df[["city", "flag", "qty"]], columns=["city"])
    assert len(wide) == len(df) and "qty" in wide.columns
    return wide


@operation("city", lazy=True)
def astype_category(df):
    city = collect(df["city"].astype("category"))
    assert set(city.cat.categories) == set(truth(df, "city"))
    assert (city.cat.codes >= 0).all()
    assert city.astype(str).tolist() == truth(df, "city")
    return city


# ---------------------------------------------------------------- strings

@operation("name", "city", lazy=True)
def str_accessors(df):
    names = truth(df, "name")
    assert plain(collect(df["name"].str.lower())) == [None if n is None else n.lower() for n in names]
    has_an = collect(df["name"].str.contains("an"))  # a null name: null, or False with pandas 3's str dtype
    assert [h if n is not None else bool(h) for h, n in zip(plain(has_an), names)] == [
        n is not None and "an" in n for n in names]
    assert plain(collect(df["name"].str.len())) == [None if n is None else len(n) for n in names]
    first = collect(df["name"].str.split(" ").str[0])
    assert plain(first) == [None if n is None else n.split(" ")[0] for n in names]
    assert collect(df["city"].str.upper()).tolist() == [c.upper() for c in truth(df, "city")]
    return first


# ---------------------------------------------------------------- numpy on columns

@operation("price", "flag")
def numpy_where(df):
    band = np.where(df["price"] > 20, "dear", "cheap")  # a null price is not above 20
    assert band.tolist() == ["dear" if p is not None and p > 20 else "cheap" for p in truth(df, "price")]
    as_int = np.where(df["flag"], 1, 0)
    assert as_int.tolist() == [int(f) for f in truth(df, "flag")]
    return band


@operation("price", "ratio", "qty")
def numpy_log(df):
    assert_close(np.log(df["price"]), np.log(floats(truth(df, "price"))))
    assert_close(np.log(df["ratio"]), np.log(floats(truth(df, "ratio"))), rtol=1e-6)
    logged = np.log1p(df["qty"].clip(lower=0))
    assert_close(logged, np.log1p(np.clip(floats(truth(df, "qty")), 0, None)))
    return logged


@operation("id", "qty", "price", "ratio", "flag", "name")
def to_numpy(df):
    ids = df["id"].to_numpy()
    assert ids.dtype.kind == "i" and ids.tolist() == truth(df, "id")
    for column in ("qty", "price", "ratio", "flag"):
        values = df[column].to_numpy()
        assert values.dtype.kind in "iufb", f"{column}.to_numpy() gives {values.dtype}"
        assert_close(values, truth(df, column), rtol=1e-6)
    matrix = df[["id", "price", "ratio"]].to_numpy()
    assert matrix.dtype.kind == "f", f"to_numpy() of numeric columns gives {matrix.dtype}"
    with_nulls = df[["id", "qty", "price"]].to_numpy(dtype="float64", na_value=np.nan)  # pandas' way for Int64
    assert_close(with_nulls[:, 1], truth(df, "qty"))
    assert np.asarray(df["ratio"]).dtype.kind == "f"
    assert plain(df["name"].to_numpy()) == truth(df, "name")
    return matrix


# ---------------------------------------------------------------- models

def _features(df):
    return df[NUMBERS].fillna(0), df["label"]


def _base_rate(df) -> float:
    label = truth(df, "label")
    return max(np.mean(label), 1 - np.mean(label))


@operation(*NUMBERS, "label", "id", needs=("sklearn",))
def logistic_regression(df):
    from sklearn.linear_model import LogisticRegression

    X, y = _features(df)
    model = LogisticRegression(max_iter=1000).fit(X, y)
    chance = model.predict_proba(X)[:, 1]
    assert chance.shape == (len(df),) and ((chance >= 0) & (chance <= 1)).all()
    assert model.score(X, y) > _base_rate(df) + 0.05
    return model


@operation(*NUMBERS, "label", "id", needs=("xgboost",))
def xgboost_classifier(df):
    from xgboost import XGBClassifier

    X, y = _features(df)
    model = XGBClassifier(n_estimators=30, max_depth=3, n_jobs=1, random_state=0).fit(X, y)
    assert model.predict_proba(X).shape == (len(df), 2)
    assert (model.predict(X) == np.array(truth(df, "label"))).mean() > _base_rate(df) + 0.05
    return model


# ---------------------------------------------------------------- missing values

@operation("qty", "price", "name", "maybe", "id")
def missing_values(df):
    qty, price, names = truth(df, "qty"), truth(df, "price"), truth(df, "name")
    assert df["qty"].isna().sum() == qty.count(None)
    assert df.isna().sum()["price"] == price.count(None)
    assert df["price"].fillna(df["price"].mean()).notna().all()
    kept = df.dropna(subset=["qty", "price"])
    assert len(kept) == sum(q is not None and p is not None for q, p in zip(qty, price))
    assert (df["name"].fillna("unknown") == "unknown").sum() == names.count(None)
    assert df["maybe"].fillna(False).sum() == truth(df, "maybe").count(True)
    return kept


@operation("qty", "maybe", "flag")
def fillna_zero(df):
    """What a user writes before a model: every null to 0 (False for a boolean)."""
    filled = df[["qty", "maybe", "flag"]].fillna({"qty": 0, "maybe": False})
    assert filled.notna().all().all()
    assert filled["maybe"].astype(int).sum() == truth(df, "maybe").count(True)
    assert filled["qty"].sum() == sum(q for q in truth(df, "qty") if q is not None)
    return filled


# ---------------------------------------------------------------- reshaping and selection

@operation("price", "city", "ts")
def sort_values(df):
    dearest = df.sort_values("price", ascending=False)
    price = floats(dearest["price"])
    known = price[~np.isnan(price)]
    assert (np.diff(known) <= 0).all() and np.isnan(price[len(known):]).all()  # nulls last
    by_city = df.sort_values(["city", "ts"])
    assert by_city["city"].tolist() == sorted(truth(df, "city"))
    assert floats(df.nlargest(3, "price")["price"]).tolist() == sorted(known)[-3:][::-1]
    return by_city


@operation("city", "maybe", "qty")
def value_counts(df):
    assert df["city"].value_counts().to_dict() == Counter(truth(df, "city"))
    maybe = df["maybe"].value_counts(dropna=False)
    assert maybe.sum() == len(df) and maybe[True] == truth(df, "maybe").count(True)
    qty = df["qty"].value_counts()
    assert {int(k): v for k, v in qty.items()} == Counter(q for q in truth(df, "qty") if q is not None)
    assert math.isclose(df["city"].value_counts(normalize=True).sum(), 1.0)
    return qty


@operation("price", "city", "qty", "flag")
def query(df):
    price, city, qty, flag = truth(df, "price"), truth(df, "city"), truth(df, "qty"), truth(df, "flag")
    paris = df.query("price > 10 and city == 'Paris'")
    assert len(paris) == sum(p is not None and p > 10 and c == "Paris" for p, c in zip(price, city))
    flagged = df.query("qty >= 0 and flag")
    assert len(flagged) == sum(q is not None and q >= 0 and f for q, f in zip(qty, flag))
    return paris


@operation("city", "flag", "price", "qty")
def pivot_table(df):
    table = df.pivot_table(index="city", columns="flag", values="price", aggfunc="mean")
    city, flag, price = truth(df, "city"), truth(df, "flag"), floats(truth(df, "price"))
    for c in set(city):
        for f in (True, False):
            rows = np.array([d == c and g == f for d, g in zip(city, flag)]) & ~np.isnan(price)
            if rows.any():
                assert math.isclose(table.loc[c, f], price[rows].mean())
    totals = df.pivot_table(index="city", values="qty", aggfunc="sum")
    assert totals["qty"].sort_index().tolist() == list(by_group(city, truth(df, "qty"), np.sum).values())
    return table


@operation("city", "id", "price", "qty")
def merge(df):
    countries = pd.DataFrame({"city": list(COUNTRIES), "country": list(COUNTRIES.values())})
    joined = df.merge(countries, on="city", how="left")
    assert len(joined) == len(df)
    assert joined["country"].tolist() == [COUNTRIES[c] for c in truth(joined, "city")]
    both = df[["id", "price"]].merge(df[["id", "qty"]], on="id")
    assert len(both) == len(df) and plain(both["qty"]) == truth(both, "qty")
    means = df.groupby("city", as_index=False)["price"].mean().rename(columns={"price": "city_mean"})
    with_mean = df.merge(means, on="city")
    assert_close(with_mean["city_mean"], [by_group(truth(df, "city"), truth(df, "price"), np.mean)[c]
                                          for c in truth(with_mean, "city")])
    return joined


@operation("ts", "qty", "price")
def cumulative_and_diff(df):
    ordered = ts_order(df)
    running = ordered["qty"].fillna(0).cumsum()
    assert running.tolist() == np.cumsum([q or 0 for q in truth(ordered, "qty")]).tolist()
    step = ordered["price"].diff()
    price = floats(truth(ordered, "price"))
    assert_close(step, np.concatenate([[np.nan], np.diff(price)]))
    return running


@operation("qty", "price", "ratio", "label")
def describe_and_corr(df):
    summary = df[["qty", "price", "ratio"]].describe()
    assert summary.loc["count", "price"] == np.sum(~np.isnan(floats(truth(df, "price"))))
    assert math.isclose(summary.loc["mean", "qty"], np.nanmean(floats(truth(df, "qty"))))
    corr = df[["qty", "price", "ratio", "label"]].corr()
    assert corr.shape == (4, 4) and np.allclose(np.diag(corr.to_numpy(dtype=float)), 1)
    return corr


@operation("price", "qty", "city")
def apply_and_map(df):
    tier = df["price"].map(lambda p: "dear" if p > 20 else "cheap")  # a null price maps to "cheap"
    assert (tier == "dear").sum() == sum(p is not None and p > 20 for p in truth(df, "price"))
    label = df.apply(lambda row: f"{row['city']}:{row['qty']}", axis=1)
    assert label.str.startswith(tuple(CITIES)).all()
    country = df["city"].map(COUNTRIES)
    assert country.tolist() == [COUNTRIES[c] for c in truth(df, "city")]
    return label


@operation("amount")
def decimals(df):
    amounts = truth(df, "amount")
    assert Decimal(str(df["amount"].sum())) == sum(a for a in amounts if a is not None)
    assert_close(df["amount"].astype(float), [None if a is None else float(a) for a in amounts])
    return df["amount"].sum()
