//! The key map of `slo-probe top`: the conventions of bottom, htop and k9s (q or Ctrl-C quit,
//! `?` help, Esc back, `/` filter, arrows and j/k move, Enter drills in, Tab cycles the panes,
//! space or f freezes, s sorts). While the filter is typed, keys are text.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseEvent, MouseEventKind};

use super::app::Action;

/// The help text: (keys, what they do).
pub const HELP: [(&str, &str); 12] = [
    ("q, Ctrl-C", "quit"),
    ("?", "this help"),
    (
        "Esc",
        "back: close a popup, clear the filter, return to the ranks",
    ),
    (
        "/",
        "filter ranks, violations and operators (Enter keeps it)",
    ),
    ("↑ ↓, j k", "move"),
    ("PgUp PgDn, g G", "move a page, to the top or bottom"),
    (
        "Enter",
        "drill in: a rank to its SLO tree, a node or violation to its details",
    ),
    ("Tab, Shift-Tab", "next, previous pane"),
    ("space, f", "freeze the display (data keeps arriving)"),
    (
        "s",
        "sort: ranks by rank, score, p99, pid; operators by share or name",
    ),
    (
        "--mouse",
        "wheel moves (mouse capture is off by default: it blocks copy-paste)",
    ),
    (
        "--url URL",
        "attach to another agent; it reconnects by itself",
    ),
];

/// The action of a key, if any. `editing`: the filter is being typed.
pub fn action(key: KeyEvent, editing: bool) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && key.code == KeyCode::Char('c') {
        return Some(Action::Quit);
    }
    if editing {
        return match key.code {
            KeyCode::Esc => Some(Action::Back),
            KeyCode::Enter => Some(Action::FilterDone),
            KeyCode::Backspace => Some(Action::Backspace),
            KeyCode::Char(c) if !ctrl => Some(Action::Input(c)),
            _ => None,
        };
    }
    if ctrl {
        return match key.code {
            KeyCode::Char('d') => Some(Action::PageDown),
            KeyCode::Char('u') => Some(Action::PageUp),
            _ => None,
        };
    }
    Some(match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('?') => Action::Help,
        KeyCode::Esc => Action::Back,
        KeyCode::Char('/') => Action::Filter,
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::Home | KeyCode::Char('g') => Action::Top,
        KeyCode::End | KeyCode::Char('G') => Action::Bottom,
        KeyCode::Enter | KeyCode::Right | KeyCode::Char('l') => Action::Enter,
        KeyCode::Left | KeyCode::Char('h') => Action::Back,
        KeyCode::Tab => Action::NextPane,
        KeyCode::BackTab => Action::PrevPane,
        KeyCode::Char(' ') | KeyCode::Char('f') => Action::Freeze,
        KeyCode::Char('s') => Action::Sort,
        _ => return None,
    })
}

/// The action of a mouse event (with `--mouse`): the wheel moves.
pub fn mouse(m: MouseEvent) -> Option<Action> {
    match m.kind {
        MouseEventKind::ScrollUp => Some(Action::Up),
        MouseEventKind::ScrollDown => Some(Action::Down),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn the_conventional_keys() {
        for (code, want) in [
            (KeyCode::Char('q'), Action::Quit),
            (KeyCode::Char('?'), Action::Help),
            (KeyCode::Esc, Action::Back),
            (KeyCode::Char('/'), Action::Filter),
            (KeyCode::Up, Action::Up),
            (KeyCode::Char('k'), Action::Up),
            (KeyCode::Down, Action::Down),
            (KeyCode::Char('j'), Action::Down),
            (KeyCode::Enter, Action::Enter),
            (KeyCode::Tab, Action::NextPane),
            (KeyCode::BackTab, Action::PrevPane),
            (KeyCode::Char(' '), Action::Freeze),
            (KeyCode::Char('f'), Action::Freeze),
            (KeyCode::Char('s'), Action::Sort),
        ] {
            assert_eq!(action(key(code), false), Some(want), "{code:?}");
        }
        assert_eq!(action(key(KeyCode::Char('x')), false), None);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(action(ctrl_c, false), Some(Action::Quit));
        assert_eq!(action(ctrl_c, true), Some(Action::Quit));
    }

    #[test]
    fn typing_a_filter_takes_the_letters() {
        assert_eq!(
            action(key(KeyCode::Char('q')), true),
            Some(Action::Input('q'))
        );
        assert_eq!(
            action(key(KeyCode::Char('j')), true),
            Some(Action::Input('j'))
        );
        assert_eq!(action(key(KeyCode::Enter), true), Some(Action::FilterDone));
        assert_eq!(action(key(KeyCode::Esc), true), Some(Action::Back));
        assert_eq!(
            action(key(KeyCode::Backspace), true),
            Some(Action::Backspace)
        );
        let mut release = key(KeyCode::Char('q'));
        release.kind = KeyEventKind::Release;
        assert_eq!(action(release, false), None);
    }
}
