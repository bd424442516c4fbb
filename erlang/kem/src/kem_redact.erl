%%% @doc What a client may see of a failure's detail: text, depth-limited,
%%% with node paths replaced by `<path>'. The port's details name kernel
%%% directories, cache files and the checkout; a remote caller of the
%%% device has no business knowing the node's filesystem.
-module(kem_redact).
-export([text/1]).

%% An absolute path: a `/' that starts a word (not the `//' of a URL, which
%% follows a `:') and runs to the next space, quote or bracket.
-define(PATH, "(^|[\\s'\"(\\[=,])/[^\\s'\")\\],]+").

-spec text(term()) -> binary().
text(Detail) ->
    re:replace(to_text(Detail), ?PATH, "\\1<path>", [global, {return, binary}, unicode]).

to_text(Bin) when is_binary(Bin) -> Bin;
%% Depth-limited: a reason may carry a caller's whole input binary.
to_text(Term) -> iolist_to_binary(io_lib:format("~0P", [Term, 12])).

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

redact_test() ->
    ?assertEqual(<<"no kernel 'x' in <path>">>, text(<<"no kernel 'x' in /srv/node/kernels">>)),
    ?assertEqual(<<"dirs: <path>, <path>">>, text(<<"dirs: /a/b, /c">>)),
    ?assertEqual(<<"'<path>' missing">>, text(<<"'/home/op/.cache/kem/x.wgsl' missing">>)),
    %% URLs and ids stay.
    ?assertEqual(<<"GET https://arweave.net/abc failed">>, text(<<"GET https://arweave.net/abc failed">>)),
    ?assertEqual(<<"{kernel_not_found,<<\"<path>\">>}">>, text({kernel_not_found, <<"/x/y">>})).
-endif.
