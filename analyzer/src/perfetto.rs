//! todo
pub fn render(_r: &crate::Report) -> String {
    String::new()
}
