package mlplane.flink;

import static org.apache.flink.table.annotation.ArgumentTrait.REQUIRE_ON_TIME;
import static org.apache.flink.table.annotation.ArgumentTrait.SET_SEMANTIC_TABLE;

import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import org.apache.flink.table.annotation.ArgumentHint;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.annotation.FunctionHint;
import org.apache.flink.table.annotation.StateHint;
import org.apache.flink.table.api.dataview.MapView;
import org.apache.flink.table.functions.ProcessTableFunction;
import org.apache.flink.types.Row;

/**
 * Live rows of a view over a trailing window, one per entity and millisecond with events, once the
 * watermark passes that millisecond t: the view over the entity's events in (t - window, t], its
 * value at window_end t + 1 ms. The same rows as an OVER aggregation with RANGE (window - 1 ms)
 * PRECEDING, at a constant cost per event: Flink's OVER operator walks every timestamp the entity
 * holds at each row it emits and keeps each event's whole row, so its work per event grew with the
 * window's events (at 20,000 events/s, with an hour of them).
 *
 * <p>The entity's state is a slice per millisecond with events (counts, and the qualifying values
 * of last_n until the slice is emitted) and the window's totals. Each slice sets two timers: at t it
 * joins the totals and the row is emitted, at t + window it leaves them. last_n needs no leaving:
 * the n most recent distinct values with their latest time are kept, and those older than the
 * window dropped when read (if one of them is out of the window, so is every value not kept).
 *
 * <p>Input columns: `counted` BIGINT, bit i set when the event counts for count i; `listed`
 * STRING, the event's last_n value when it qualifies (else NULL). Ties within a millisecond are
 * ordered by value, descending (numerically when `numeric_values`), as the polars plan orders them.
 */
@FunctionHint(output = @DataTypeHint("ROW<window_end TIMESTAMP(3), counts ARRAY<BIGINT>, latest ARRAY<STRING>>"))
public class LiveWindowFunction extends ProcessTableFunction<Row> {

    /** The events of one entity at one millisecond. */
    public static class Slice {
        public long[] counts;
        public String[] values; // distinct qualifying last_n values; emptied once emitted
    }

    /** The window's totals for one entity, and the settings the timers need. */
    public static class Totals {
        public long windowMillis;
        public boolean numeric;
        public int n;
        public long[] counts;
        public String[] latest; // the n most recent distinct values, newest first
        public long[] latestAt; // each one's latest time
    }

    public void eval(
            Context ctx,
            @StateHint(name = "slices", ttl = "0 ms") MapView<Long, Slice> slices,
            // one entry, not a POJO value state: the value state's updates from onTimer were lost in
            // a restore from the changelog (rows after a crash missed events joined before it)
            @StateHint(name = "totals", ttl = "0 ms") MapView<Integer, Totals> totalsState,
            @ArgumentHint(value = {SET_SEMANTIC_TABLE, REQUIRE_ON_TIME}, name = "input") Row input,
            @ArgumentHint(name = "window_millis") Long windowMillis,
            @ArgumentHint(name = "counts") Integer counts,
            @ArgumentHint(name = "n") Integer n,
            @ArgumentHint(name = "numeric_values") Boolean numeric)
            throws Exception {
        TimeContext<Long> time = ctx.timeContext(Long.class);
        long t = time.time();
        Totals totals = totalsState.get(0);
        if (totals == null) { // written here only when new: a put per event was a third of the work
            totals = new Totals();
            totals.windowMillis = windowMillis;
            totals.numeric = numeric;
            totals.n = n;
            totals.counts = new long[counts];
            totals.latest = new String[0];
            totals.latestAt = new long[0];
            totalsState.put(0, totals);
        }
        Slice slice = slices.get(t);
        if (slice == null) {
            slice = new Slice();
            slice.counts = new long[counts];
            slice.values = new String[0];
            time.registerOnTime(t);
            time.registerOnTime(t + totals.windowMillis);
        }
        Long counted = input.getFieldAs("counted");
        for (int i = 0; i < counts && counted != null; i++) {
            if ((counted >> i & 1) == 1) {
                slice.counts[i]++;
            }
        }
        String listed = input.getFieldAs("listed");
        if (listed != null && !Arrays.asList(slice.values).contains(listed)) {
            slice.values = Arrays.copyOf(slice.values, slice.values.length + 1);
            slice.values[slice.values.length - 1] = listed;
        }
        slices.put(t, slice);
    }

    public void onTimer(OnTimerContext ctx, MapView<Long, Slice> slices, MapView<Integer, Totals> totalsState)
            throws Exception {
        long now = ctx.timeContext(Long.class).time();
        Totals totals = totalsState.get(0);
        if (totals == null) { // never: an entity's totals go with its last slice, after its last timer
            return;
        }
        // leaving first: the slice at now - window is out of (now - window, now]
        Slice leaving = slices.get(now - totals.windowMillis);
        if (leaving != null) {
            for (int i = 0; i < totals.counts.length; i++) {
                totals.counts[i] -= leaving.counts[i];
            }
            slices.remove(now - totals.windowMillis);
        }
        Slice joining = slices.get(now);
        if (joining != null) { // each time's timer fires once: for its slice, and for the one leaving
            for (int i = 0; i < totals.counts.length; i++) {
                totals.counts[i] += joining.counts[i];
            }
            keepLatest(totals, joining.values, now);
            if (joining.values.length > 0) { // only its counts are needed, when it leaves
                joining.values = new String[0];
                slices.put(now, joining);
            }
            collect(Row.of(at(now + 1), boxed(totals.counts), inWindow(totals, now)));
        }
        if (slices.isEmpty()) { // an idle entity: nothing left, no timers pending
            // not ctx.clearAll(): clearing timers from onTimer lost other entities' timers (rows
            // went missing, tests/streaming/test_live_rows.py has the rare users that show it)
            totalsState.remove(0);
        } else {
            totalsState.put(0, totals);
        }
    }

    private static void keepLatest(Totals totals, String[] values, long now) {
        Comparator<String> order =
                totals.numeric ? Comparator.comparingLong(Long::parseLong) : Comparator.naturalOrder();
        List<String> newest = new ArrayList<>(Arrays.asList(values));
        newest.sort(order.reversed());
        List<Long> times = new ArrayList<>();
        newest.forEach(v -> times.add(now));
        for (int i = 0; i < totals.latest.length && newest.size() < totals.n; i++) {
            if (!newest.contains(totals.latest[i])) {
                newest.add(totals.latest[i]);
                times.add(totals.latestAt[i]);
            }
        }
        int kept = Math.min(newest.size(), totals.n);
        totals.latest = newest.subList(0, kept).toArray(new String[0]);
        totals.latestAt = times.subList(0, kept).stream().mapToLong(Long::longValue).toArray();
    }

    private static String[] inWindow(Totals totals, long now) {
        int k = 0;
        while (k < totals.latest.length && totals.latestAt[k] > now - totals.windowMillis) {
            k++;
        }
        return Arrays.copyOf(totals.latest, k);
    }

    private static Long[] boxed(long[] counts) {
        return Arrays.stream(counts).boxed().toArray(Long[]::new);
    }

    private static LocalDateTime at(long epochMillis) {
        return LocalDateTime.ofEpochSecond(
                Math.floorDiv(epochMillis, 1000L),
                (int) Math.floorMod(epochMillis, 1000L) * 1_000_000,
                ZoneOffset.UTC);
    }
}
