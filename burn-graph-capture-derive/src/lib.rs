//! `#[derive(StepInput)]`: a batch struct lists every tensor it holds.
//!
//! Re-exported by `burn-graph-capture`, whose documentation of `StepInput` describes
//! the attributes. The generated impl calls each field's own `StepInput` impl, in
//! declaration order, with the field's type as the span: a field that is not an input
//! fails to compile there, unless `#[step_input(key)]` or `#[step_input(skip)]` says
//! what it is.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, GenericParam, Index, Member, Type, parse_macro_input};

/// Derives `burn_graph_capture::StepInput` for a struct of inputs.
#[proc_macro_derive(StepInput, attributes(step_input))]
pub fn derive_step_input(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// What a field is, for the batch.
enum Role {
    /// An input: a tensor, a tuple of inputs or a nested batch struct.
    Input,
    /// A host value the step depends on: graphs are keyed by it.
    Key,
    /// A host value the step never reads.
    Skip,
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(
            input.ident.span(),
            "StepInput can only be derived for structs",
        ));
    };
    let backend = backend_type(input)?;
    let name = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let mut predicates: Vec<Tokens> = where_clause
        .map(|w| w.predicates.iter().map(|p| quote!(#p)).collect())
        .unwrap_or_default();
    predicates.push(quote!(#backend: ::burn_graph_capture::__private::AutodiffBackend));

    let krate = quote!(::burn_graph_capture);
    let inner =
        quote!(<#backend as ::burn_graph_capture::__private::AutodiffBackend>::InnerBackend);
    let mut collect = Vec::new();
    let mut rebuild = Vec::new();
    let mut keys = Vec::new();
    for (index, field) in data.fields.iter().enumerate() {
        let member = match &field.ident {
            Some(ident) => Member::Named(ident.clone()),
            None => Member::Unnamed(Index::from(index)),
        };
        let ty = &field.ty;
        let span = ty.span();
        match role(field)? {
            Role::Input => {
                collect.push(quote_spanned!(span=>
                    <#ty as #krate::StepInput<#backend>>::collect_tensors(&self.#member, tensors);
                ));
                rebuild.push((
                    member.clone(),
                    quote_spanned!(span=>
                        <#ty as #krate::StepInput<#backend>>::with_tensors(&self.#member, tensors)
                    ),
                ));
                keys.push(quote_spanned!(span=>
                    <#ty as #krate::StepInput<#backend>>::hash_key(&self.#member, state);
                ));
            }
            Role::Key => {
                rebuild.push((member.clone(), clone(ty, &member)));
                keys.push(quote_spanned!(span=>
                    #krate::__private::hash_key_value::<#ty>(&self.#member, state);
                ));
            }
            Role::Skip => rebuild.push((member.clone(), clone(ty, &member))),
        }
    }
    let fields = rebuild
        .iter()
        .map(|(member, value)| quote!(#member: #value));
    Ok(quote! {
        impl #impl_generics #krate::StepInput<#backend> for #name #ty_generics
        where #(#predicates),*
        {
            fn collect_tensors(
                &self,
                tensors: &mut ::std::vec::Vec<#krate::AnyTensor<#inner>>,
            ) {
                #(#collect)*
            }

            fn with_tensors(
                &self,
                tensors: &mut ::std::vec::IntoIter<#krate::AnyTensor<#inner>>,
            ) -> Self {
                Self { #(#fields),* }
            }

            fn hash_key(&self, state: &mut dyn ::std::hash::Hasher) {
                #(#keys)*
            }
        }
    })
}

fn clone(ty: &Type, member: &Member) -> Tokens {
    quote_spanned!(ty.span()=> <#ty as ::std::clone::Clone>::clone(&self.#member))
}

/// The backend the batch is for: `#[step_input(backend = T)]`, else the struct's first
/// type parameter.
fn backend_type(input: &DeriveInput) -> syn::Result<Tokens> {
    let mut backend = None;
    for attr in input
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("step_input"))
    {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("backend") {
                let ty: Type = meta.value()?.parse()?;
                backend = Some(quote!(#ty));
                Ok(())
            } else {
                Err(meta.error("expected `backend = Type` on the struct"))
            }
        })?;
    }
    if let Some(backend) = backend {
        return Ok(backend);
    }
    input
        .generics
        .params
        .iter()
        .find_map(|param| match param {
            GenericParam::Type(ty) => {
                let ident = &ty.ident;
                Some(quote!(#ident))
            }
            _ => None,
        })
        .ok_or_else(|| {
            syn::Error::new(
                Span::call_site(),
                "StepInput needs the batch's backend: make it the struct's first type \
                 parameter, or say `#[step_input(backend = YourBackend)]`",
            )
        })
}

fn role(field: &syn::Field) -> syn::Result<Role> {
    let mut role = Role::Input;
    for attr in field
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("step_input"))
    {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("key") {
                role = Role::Key;
                Ok(())
            } else if meta.path.is_ident("skip") {
                role = Role::Skip;
                Ok(())
            } else {
                Err(meta.error("expected `key` (a host value graphs are keyed by) or `skip` (a value the step never reads)"))
            }
        })?;
    }
    Ok(role)
}
