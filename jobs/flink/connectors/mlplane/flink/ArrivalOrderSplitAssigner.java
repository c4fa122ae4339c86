package mlplane.flink;

import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.Optional;
import java.util.PriorityQueue;
import org.apache.flink.connector.file.src.FileSourceSplit;
import org.apache.flink.connector.file.src.assigners.FileSplitAssigner;

/**
 * Hands out files oldest first (modification time, then path). Flink's own assigners return the
 * files of one directory scan in no particular order (the simple one newest first), so a job that
 * lags reads a newer file before an older one and drops the older one's events as late.
 */
public final class ArrivalOrderSplitAssigner implements FileSplitAssigner {

    static final Comparator<FileSourceSplit> ARRIVAL =
            Comparator.comparingLong(FileSourceSplit::fileModificationTime)
                    .thenComparing(split -> split.path().toString())
                    .thenComparingLong(FileSourceSplit::offset);

    private final PriorityQueue<FileSourceSplit> waiting = new PriorityQueue<>(ARRIVAL);

    public ArrivalOrderSplitAssigner(Collection<FileSourceSplit> splits) {
        waiting.addAll(splits);
    }

    @Override
    public Optional<FileSourceSplit> getNext(String hostname) {
        return Optional.ofNullable(waiting.poll());
    }

    @Override
    public void addSplits(Collection<FileSourceSplit> splits) {
        waiting.addAll(splits);
    }

    @Override
    public Collection<FileSourceSplit> remainingSplits() {
        ArrayList<FileSourceSplit> remaining = new ArrayList<>(waiting);
        remaining.sort(ARRIVAL);
        return remaining;
    }

    @Override
    public String toString() {
        return "ArrivalOrderSplitAssigner " + waiting.size() + " waiting";
    }
}
