//! Captures: frames streamed from a file (mapped or read), events and process frames handed
//! to the replay, and what the reader met (cuts, corrupt frames, gaps) in the input's report.

use crate::replay::{Replayer, MAX_CORRUPT_LISTED};
use crate::report::*;
use crate::AnalyzeError;
use vramhook_model::Model;
use vramhook_protocol::capture::{
    CaptureError, CaptureHeader, CaptureReader, Frame, ProcessEnd, ProcessInfo, SeekSource,
};
use vramhook_protocol::record::Event;

/// One capture read frame by frame: the reader, and what it met (its input report).
pub(crate) struct Cursor<S: SeekSource> {
    path: String,
    reader: CaptureReader<S>,
    rep: InputReport,
    header: CaptureHeader,
    first_before: Option<u64>,
}

/// What a cursor hands over from one frame (owned, for a replay that merges captures).
pub(crate) enum Owned {
    Event(Event),
    Process(ProcessInfo),
    End(ProcessEnd),
    Checkpoint(Vec<u8>),
}

impl<S: SeekSource> Cursor<S> {
    /// The capture's header read; `None` when there is none (said in the input's report,
    /// pushed already), or an error in strict mode.
    pub(crate) fn open(r: &mut Replayer, path: &str, input: S) -> Result<Option<Cursor<S>>, AnalyzeError> {
        let mut rep = InputReport::new(path, InputKind::Capture, InputStatus::Complete);
        let reader = match CaptureReader::from_source(input) {
            Ok(reader) => reader,
            Err(e) => {
                match e {
                    // Said by `truncated_at` (an error too would say it twice).
                    CaptureError::Truncated(n) => {
                        rep.status = InputStatus::Truncated;
                        rep.truncated_at = Some(n);
                        if r.opts.strict {
                            r.inputs.push(rep);
                            return Err(AnalyzeError::Truncated { path: path.to_string(), offset: n });
                        }
                    }
                    e => {
                        rep.status = InputStatus::Unreadable;
                        rep.error = Some(e.to_string());
                    }
                }
                r.inputs.push(rep);
                return Ok(None);
            }
        };
        rep.host = Some(reader.header().host.clone());
        rep.format_version = Some(reader.header().version);
        let header = reader.header().clone();
        if r.clock.is_none() && header.wall_anchor_ns != 0 {
            r.clock = Some((header.mono_anchor_ns, header.wall_anchor_ns));
        }
        Ok(Some(Cursor { path: path.to_string(), reader, rep, header, first_before: r.first_ts }))
    }

    /// Reads the next frame and hands its content to `f`; `Ok(false)` at the end (or where
    /// the reader cannot go on). Cuts, corrupt frames and gaps go to the input's report.
    pub(crate) fn step(
        &mut self,
        r: &mut Replayer,
        mut f: impl FnMut(&mut Replayer, Frame<'_>),
    ) -> Result<bool, AnalyzeError> {
        let (rep, path) = (&mut self.rep, self.path.as_str());
        match self.reader.next_frame() {
            Ok(None) => Ok(false),
            Ok(Some(frame)) => {
                rep.frames += 1;
                match frame {
                    Frame::Events(records) => {
                        rep.events += records.len() as u64;
                        f(r, Frame::Events(records));
                    }
                    Frame::Note(_) => {}
                    Frame::Unknown(_) => rep.unknown_frames += 1,
                    Frame::End { events, frames } => {
                        // The writer's own counts: a frame deleted whole (checksums all
                        // right) shows up only here.
                        let (read_events, read_frames) = (rep.events, rep.frames);
                        if events != read_events || frames != read_frames {
                            rep.missing_events = Some(events.saturating_sub(read_events));
                            rep.missing_frames = Some(frames.saturating_sub(read_frames));
                            if rep.status == InputStatus::Complete {
                                rep.status = InputStatus::Gap;
                            }
                            r.notes.push(format!(
                                "{path}: the end frame counts {frames} frames and {events} events, but {read_frames} \
                                 frames and {read_events} events were read: {} frames and {} events are missing",
                                frames.saturating_sub(read_frames),
                                events.saturating_sub(read_events)
                            ));
                        }
                    }
                    other => f(r, other),
                }
                Ok(true)
            }
            Err(CaptureError::Truncated(n)) => {
                rep.status = InputStatus::Truncated;
                rep.truncated_at = Some(n);
                if r.opts.strict {
                    r.inputs.push(rep.clone());
                    return Err(AnalyzeError::Truncated { path: path.to_string(), offset: n });
                }
                Ok(false)
            }
            Err(CaptureError::Corrupt { offset, reason }) => {
                rep.status = InputStatus::Corrupt;
                if r.opts.strict {
                    r.inputs.push(rep.clone());
                    return Err(AnalyzeError::Corrupt { path: path.to_string(), offset, reason });
                }
                let skipped = match self.reader.resync() {
                    Ok(s) => s,
                    Err(e) => {
                        rep.error = Some(e.to_string());
                        None
                    }
                };
                if rep.corrupt_frames.len() < MAX_CORRUPT_LISTED {
                    rep.corrupt_frames.push(CorruptFrame { offset, reason, skipped_bytes: skipped });
                } else {
                    rep.corrupt_frames_unlisted += 1;
                }
                Ok(skipped.is_some())
            }
            Err(e) => {
                rep.status = InputStatus::Unreadable;
                rep.error = Some(e.to_string());
                Ok(false)
            }
        }
    }

    /// The input's report, with what the reader read.
    pub(crate) fn finish(mut self, r: &mut Replayer) {
        let rep = &mut self.rep;
        rep.bytes_read = self.reader.offset();
        if let Some(cut) = self.reader.shrank() {
            // Another program truncated the file while it was mapped: what follows the cut
            // read as zeros (reported above as corrupt), not as data.
            rep.status = InputStatus::Truncated;
            rep.truncated_at = Some(rep.truncated_at.map_or(cut, |t| t.min(cut)));
            rep.error = Some(format!("the file shrank while it was read (cut at byte {cut} by another program)"));
        }
        if self.first_before.is_none() {
            if let Some(f) = r.first_ts {
                rep.wall_start_ns = Some(self.header.wall_time_ns(f));
            }
        }
        r.inputs.push(self.rep);
    }

    /// Owned copies of a frame's content, for a merge.
    fn owned(frame: Frame<'_>, out: &mut std::collections::VecDeque<Owned>) {
        match frame {
            Frame::Events(records) => out.extend(records.iter().map(|raw| Owned::Event(Event::from_raw(raw)))),
            Frame::Process(info) => out.push_back(Owned::Process(info)),
            Frame::ProcessEnd(end) => out.push_back(Owned::End(end)),
            Frame::Checkpoint(bytes) => out.push_back(Owned::Checkpoint(bytes.to_vec())),
            Frame::Note(_) | Frame::Unknown(_) | Frame::End { .. } => {}
        }
    }
}

impl Replayer {
    /// Streams one capture. Errors only in strict mode (a corrupt frame, a cut).
    pub fn capture<S: SeekSource>(&mut self, path: &str, input: S) -> Result<(), AnalyzeError> {
        let Some(mut cursor) = Cursor::open(self, path, input)? else { return Ok(()) };
        while !self.stopped && cursor.step(self, |r, frame| r.apply_frame(path, frame))? {}
        cursor.finish(self);
        Ok(())
    }

    /// Streams captures recorded side by side on one host (`vramhook run` sessions of the
    /// processes that shared a GPU, say) as one, in time order: each process's events as its
    /// own capture has them, the captures interleaved by their events' times (one host's
    /// monotonic clock), so that at a failure the other processes' memory is what it was
    /// then. Captures that follow each other (an agent's rotated files) come out in order.
    pub(crate) fn captures_merged<S: SeekSource>(&mut self, inputs: Vec<(String, S)>) -> Result<(), AnalyzeError> {
        use std::collections::VecDeque;
        struct Stream<S: SeekSource> {
            cursor: Option<Cursor<S>>,
            pending: VecDeque<Owned>,
            /// The stream's time so far: its items are ordered by it, never backwards.
            at: u64,
        }
        let next_event_ts = |pending: &VecDeque<Owned>| {
            pending.iter().find_map(|o| match o {
                Owned::Event(e) => Some(e.ts_ns),
                _ => None,
            })
        };
        let mut streams = Vec::new();
        for (path, input) in inputs {
            if let Some(cursor) = Cursor::open(self, &path, input)? {
                streams.push(Stream { cursor: Some(cursor), pending: VecDeque::new(), at: 0 });
            }
        }
        loop {
            if self.stopped {
                break;
            }
            // Each stream reads frames until it has an event pending (what comes before it
            // takes its time) or ends.
            for st in &mut streams {
                while next_event_ts(&st.pending).is_none() {
                    let Some(cursor) = st.cursor.as_mut() else { break };
                    let pending = &mut st.pending;
                    if !cursor.step(self, |_, frame| Cursor::<S>::owned(frame, pending))? {
                        if let Some(c) = st.cursor.take() {
                            c.finish(self);
                        }
                    }
                }
            }
            // The stream whose next item comes first. A frame that is no event comes with the
            // stream's next event (a process frame, a rotated file's checkpoint), or where the
            // stream is when none follows (a process's end).
            let key = |st: &Stream<S>| match st.pending.front() {
                Some(Owned::Event(e)) => Some(st.at.max(e.ts_ns)),
                Some(_) => Some(st.at.max(next_event_ts(&st.pending).unwrap_or(0))),
                None => None,
            };
            let Some(k) = (0..streams.len()).filter(|k| key(&streams[*k]).is_some()).min_by_key(|k| key(&streams[*k]))
            else {
                break;
            };
            // Its items run until another stream's next item comes first: captures that follow
            // each other are read in long runs, not one event and one comparison at a time.
            let others = (0..streams.len()).filter(|j| *j != k).filter_map(|j| key(&streams[j])).min();
            let path = streams[k].cursor.as_ref().map(|c| c.path.clone()).unwrap_or_default();
            while let Some(at) = key(&streams[k]).filter(|at| others.is_none_or(|o| *at <= o)) {
                let st = &mut streams[k];
                st.at = at;
                match st.pending.pop_front() {
                    Some(Owned::Event(e)) => self.event(&e),
                    Some(Owned::Process(info)) => self.process_info(&info),
                    Some(Owned::End(end)) => self.process_end(&end),
                    Some(Owned::Checkpoint(bytes)) => self.apply_frame(&path, Frame::Checkpoint(&bytes)),
                    None => {}
                }
                if self.stopped || next_event_ts(&streams[k].pending).is_none() {
                    break; // read on (or stop) before going further
                }
            }
        }
        for st in streams {
            if let Some(c) = st.cursor {
                c.finish(self);
            }
        }
        Ok(())
    }

    /// One frame's content into the model.
    fn apply_frame(&mut self, path: &str, frame: Frame<'_>) {
        match frame {
            Frame::Events(records) => {
                for raw in records {
                    self.event(&Event::from_raw(raw));
                }
            }
            Frame::Process(info) => self.process_info(&info),
            Frame::ProcessEnd(end) => self.process_end(&end),
            Frame::Checkpoint(bytes) => {
                // A capture that starts mid-stream (a rotated file): resume from the
                // writer's model. Later checkpoints add nothing to a full replay.
                if self.model.events() == 0 && self.applied == 0 {
                    match Model::restore(bytes).map_err(|e| e.to_string()).and_then(|m| self.resume_from(m)) {
                        Ok(()) => self.notes.push(format!("{path}: replay resumed from a model checkpoint")),
                        Err(e) => self.notes.push(format!("{path}: checkpoint ignored: {e}")),
                    }
                }
            }
            Frame::Note(_) | Frame::Unknown(_) | Frame::End { .. } => {}
        }
    }
}
