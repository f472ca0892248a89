//! Captures: frames streamed from a file (mapped or read), events and process frames handed
//! to the replay, and what the reader met (cuts, corrupt frames, gaps) in the input's report.

use crate::replay::{Replayer, MAX_CORRUPT_LISTED};
use crate::report::*;
use crate::AnalyzeError;
use vramhook_model::Model;
use vramhook_protocol::capture::{CaptureError, CaptureReader, Frame, SeekSource};
use vramhook_protocol::record::Event;

impl Replayer {
    /// Streams one capture. Errors only in strict mode (a corrupt frame, a cut).
    pub fn capture<S: SeekSource>(&mut self, path: &str, input: S) -> Result<(), AnalyzeError> {
        let mut rep = InputReport::new(path, InputKind::Capture, InputStatus::Complete);
        let mut reader = match CaptureReader::from_source(input) {
            Ok(r) => r,
            Err(e) => {
                match e {
                    // Said by `truncated_at` (an error too would say it twice).
                    CaptureError::Truncated(n) => {
                        rep.status = InputStatus::Truncated;
                        rep.truncated_at = Some(n);
                        if self.opts.strict {
                            self.inputs.push(rep);
                            return Err(AnalyzeError::Truncated { path: path.to_string(), offset: n });
                        }
                    }
                    e => {
                        rep.status = InputStatus::Unreadable;
                        rep.error = Some(e.to_string());
                    }
                }
                self.inputs.push(rep);
                return Ok(());
            }
        };
        rep.host = Some(reader.header().host.clone());
        rep.format_version = Some(reader.header().version);
        let header = reader.header().clone();
        if self.clock.is_none() && header.wall_anchor_ns != 0 {
            self.clock = Some((header.mono_anchor_ns, header.wall_anchor_ns));
        }
        let first_before = self.first_ts;
        loop {
            if self.stopped {
                break;
            }
            match reader.next_frame() {
                Ok(None) => break,
                Ok(Some(frame)) => {
                    rep.frames += 1;
                    match frame {
                        Frame::Events(records) => {
                            rep.events += records.len() as u64;
                            for raw in records {
                                self.event(&Event::from_raw(raw));
                            }
                        }
                        Frame::Process(info) => self.process_info(&info),
                        Frame::ProcessEnd(end) => self.process_end(&end),
                        Frame::Checkpoint(bytes) => {
                            // A capture that starts mid-stream (a rotated file): resume from
                            // the writer's model. Later checkpoints add nothing to a full replay.
                            if self.model.events() == 0 && self.applied == 0 {
                                match Model::restore(bytes).map_err(|e| e.to_string()).and_then(|m| self.resume_from(m))
                                {
                                    Ok(()) => {
                                        self.notes.push(format!("{path}: replay resumed from a model checkpoint"))
                                    }
                                    Err(e) => self.notes.push(format!("{path}: checkpoint ignored: {e}")),
                                }
                            }
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
                                self.notes.push(format!(
                                    "{path}: the end frame counts {frames} frames and {events} events, but {read_frames} \
                                     frames and {read_events} events were read: {} frames and {} events are missing",
                                    frames.saturating_sub(read_frames),
                                    events.saturating_sub(read_events)
                                ));
                            }
                        }
                    }
                }
                Err(CaptureError::Truncated(n)) => {
                    rep.status = InputStatus::Truncated;
                    rep.truncated_at = Some(n);
                    if self.opts.strict {
                        self.inputs.push(rep);
                        return Err(AnalyzeError::Truncated { path: path.to_string(), offset: n });
                    }
                    break;
                }
                Err(CaptureError::Corrupt { offset, reason }) => {
                    if self.opts.strict {
                        rep.status = InputStatus::Corrupt;
                        self.inputs.push(rep);
                        return Err(AnalyzeError::Corrupt { path: path.to_string(), offset, reason });
                    }
                    rep.status = InputStatus::Corrupt;
                    let skipped = match reader.resync() {
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
                    if skipped.is_none() {
                        break;
                    }
                }
                Err(e) => {
                    rep.status = InputStatus::Unreadable;
                    rep.error = Some(e.to_string());
                    break;
                }
            }
        }
        rep.bytes_read = reader.offset();
        if let Some(cut) = reader.shrank() {
            // Another program truncated the file while it was mapped: what follows the cut
            // read as zeros (reported above as corrupt), not as data.
            rep.status = InputStatus::Truncated;
            rep.truncated_at = Some(rep.truncated_at.map_or(cut, |t| t.min(cut)));
            rep.error = Some(format!("the file shrank while it was read (cut at byte {cut} by another program)"));
        }
        if first_before.is_none() {
            if let Some(f) = self.first_ts {
                rep.wall_start_ns = Some(header.wall_time_ns(f));
            }
        }
        self.inputs.push(rep);
        Ok(())
    }
}
